"""The output_dir rules of ``t3d_trl.trainer.checkpoints``, on folders laid out as the trainer saves them."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from t3d_trl.trainer import checkpoints


def make_checkpoint(output_dir, step: int, complete: bool = True):
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    save_file({"w": torch.ones(64)}, str(folder / "model.safetensors"))
    save_file({"w": torch.ones(64)}, str(folder / "t3d_reference.safetensors"))
    if complete:
        torch.save({"state": {}, "param_groups": [{"lr": 0.1}]}, folder / "optimizer.pt")
        torch.save({"last_epoch": step}, folder / "scheduler.pt")
        torch.save({"cpu": torch.random.get_rng_state()}, folder / "rng_state.pth")
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def truncate(path, size: int = 100) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def test_resume_takes_the_last_checkpoint_that_loads(tmp_path, caplog):
    make_checkpoint(tmp_path, 3)
    make_checkpoint(tmp_path, 10)  # sorted by step, not by name
    six = make_checkpoint(tmp_path, 6)
    make_checkpoint(tmp_path, 12, complete=False)  # cut short while saved
    truncate(tmp_path / "checkpoint-10" / "t3d_reference.safetensors", 40)  # any weights file counts
    assert checkpoints.resume_checkpoint(tmp_path, "true") == str(six)
    assert "checkpoint-12 has no trainer_state.json" in caplog.text
    assert "checkpoint-10/t3d_reference.safetensors is damaged" in caplog.text
    assert checkpoints.resume_checkpoint(tmp_path, "false") is None

    weights = six / "model.safetensors"
    truncate(weights, weights.stat().st_size - 16)  # header intact, the last tensor's data cut: still found
    assert checkpoints.checkpoint_problem(six).startswith(f"{weights} is damaged")
    with pytest.raises(ValueError, match=r"cannot resume from .*checkpoint-6: .* is damaged"):
        checkpoints.resume_checkpoint(tmp_path, str(six))  # named explicitly, it must load too
    with pytest.raises(ValueError, match=r"cannot resume from .*checkpoint-99: .*no such checkpoint folder"):
        checkpoints.resume_checkpoint(tmp_path, str(tmp_path / "checkpoint-99"))  # a typo: not "interrupted"


def test_a_checkpoint_without_optimizer_state_is_not_resumed_from(tmp_path, caplog):
    """A save_only_model checkpoint or a finished model (the CLI saves trainer_state.json beside it) would restart
    the optimizer and the learning-rate schedule without a word."""
    make_checkpoint(tmp_path, 2)
    model_only = make_checkpoint(tmp_path, 4)
    (model_only / "scheduler.pt").unlink()
    assert checkpoints.resume_checkpoint(tmp_path, True) == str(tmp_path / "checkpoint-2")
    assert "checkpoint-4 holds no optimizer or learning-rate scheduler state" in caplog.text
    with pytest.raises(
        ValueError,
        match=r"no scheduler.pt\): a finished model or a save_only_model checkpoint.*model_name_or",
    ):
        checkpoints.resume_checkpoint(tmp_path, str(model_only))
    (model_only / "global_step4").mkdir()  # DeepSpeed's own scheduler: its state is in DeepSpeed's folder
    assert checkpoints.checkpoint_problem(model_only) is None


def test_a_checkpoint_without_its_optimizer_state_is_not_resumed_from(tmp_path, caplog):
    """transformers loads the scheduler only beside the optimizer: without optimizer.pt it would restart both."""
    make_checkpoint(tmp_path, 2)
    four = make_checkpoint(tmp_path, 4)
    (four / "optimizer.pt").unlink()
    assert checkpoints.resume_checkpoint(tmp_path, True) == str(tmp_path / "checkpoint-2")
    assert "checkpoint-4 holds no optimizer or learning-rate scheduler state (no optimizer.pt)" in caplog.text
    # FSDP saves it as optimizer.bin (full state) or an optimizer_0/ folder (sharded); DeepSpeed in global_step*.
    for held in ("optimizer.bin", "optimizer_0", "global_step4"):
        path = four / held
        if held.endswith(".bin"):
            torch.save({"state": {}}, path)
        else:
            path.mkdir()
        assert checkpoints.checkpoint_problem(four) is None, held
        shutil.rmtree(path) if path.is_dir() else path.unlink()


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "optimizer.bin"])
def test_a_truncated_torch_file_skips_the_checkpoint(tmp_path, caplog, name):
    make_checkpoint(tmp_path, 2)
    four = make_checkpoint(tmp_path, 4)
    path = four / name
    if not path.exists():  # FSDP's optimizer state
        (four / "optimizer.pt").rename(path)
    truncate(path, path.stat().st_size - 1)  # one byte short: the zip directory at its end is cut
    assert checkpoints.resume_checkpoint(tmp_path, True) == str(tmp_path / "checkpoint-2")
    assert f"not resuming from checkpoint-4: {path} is damaged (BadZipFile" in caplog.text


def test_a_damaged_json_file_skips_the_checkpoint(tmp_path, caplog):
    make_checkpoint(tmp_path, 2)
    four = make_checkpoint(tmp_path, 4)
    (four / "trainer_state.json").write_text('{"global_step": 4, "log_hi')  # killed while written
    assert checkpoints.resume_checkpoint(tmp_path, True) == str(tmp_path / "checkpoint-2")
    assert "checkpoint-4/trainer_state.json is damaged (JSONDecodeError" in caplog.text


def test_a_checkpoint_without_its_weights_is_not_resumed_from(tmp_path, caplog):
    make_checkpoint(tmp_path, 2)
    four = make_checkpoint(tmp_path, 4)
    (four / "model.safetensors").unlink()  # t3d_reference.safetensors is not the model's
    assert checkpoints.resume_checkpoint(tmp_path, True) == str(tmp_path / "checkpoint-2")
    assert "checkpoint-4 has no weights file" in caplog.text
    save_file({"w": torch.ones(4)}, str(four / "adapter_model.safetensors"))  # an adapter's checkpoint
    (four / "adapter_config.json").write_text("{}")
    assert checkpoints.checkpoint_problem(four) is None
    (four / "adapter_model.safetensors").unlink()
    assert "has no weights file (none of adapter_model.safetensors" in checkpoints.checkpoint_problem(four)
    (four / "adapter_config.json").unlink()
    # Sharded weights: the index, and every shard it names.
    save_file({"w": torch.ones(4)}, str(four / "model-00001-of-00002.safetensors"))
    shards = {"w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}
    (four / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))
    problem = checkpoints.checkpoint_problem(four)
    assert "model-00002-of-00002.safetensors is missing (a shard" in problem
    save_file({"v": torch.ones(4)}, str(four / "model-00002-of-00002.safetensors"))
    assert checkpoints.checkpoint_problem(four) is None


def test_a_resume_with_other_settings_is_refused_naming_each_difference(tmp_path):
    args = SimpleNamespace(
        to_dict=lambda: {"loss_type": "t3d", "learning_rate": 0.01, "per_device_train_batch_size": 2},
        world_size=1,
        auto_find_batch_size=False,
    )
    saved = checkpoints.run_settings(args, block_length=4)
    assert saved == {
        "loss_type": "t3d",
        "learning_rate": 0.01,
        "per_device_train_batch_size": 2,
        "block_length": 4,
        "world_size": 1,
    }
    folder = make_checkpoint(tmp_path, 4)
    checkpoints.check_settings(folder, saved)  # written by an older version: no settings file, resumes
    checkpoints.save_settings(folder, saved)
    assert checkpoints.checkpoint_problem(folder) is None
    checkpoints.check_settings(folder, saved)
    checkpoints.check_settings(folder, {**saved, "new_setting": 1})  # one the checkpoint does not record
    now = {**saved, "loss_type": "td", "learning_rate": 0.5}
    with pytest.raises(ValueError) as info:
        checkpoints.check_settings(folder, now)
    message = str(info.value)
    assert "loss_type: checkpoint 't3d', now 'td'; learning_rate: checkpoint 0.01, now 0.5" in message
    assert "per_device_train_batch_size" not in message
    assert "resume with the checkpoint's settings, or start another run in a new output_dir" in message
    # With auto_find_batch_size transformers picks the batch size itself (and restores the checkpoint's).
    args.auto_find_batch_size = True
    assert "per_device_train_batch_size" not in checkpoints.run_settings(args, block_length=4)

    # Equivalent values are one setting: no schedule kwargs (None or {}), and the cross-process token average of
    # a single process (it changes nothing there).
    def settings(**values):
        extra = SimpleNamespace(
            to_dict=lambda: values, world_size=args.world_size, auto_find_batch_size=False
        )
        return checkpoints.run_settings(extra, block_length=4)

    checkpoints.save_settings(folder, settings(lr_scheduler_kwargs=None, average_tokens_across_devices=True))
    checkpoints.check_settings(folder, settings(lr_scheduler_kwargs={}, average_tokens_across_devices=False))
    args.world_size = 2
    checkpoints.save_settings(folder, settings(average_tokens_across_devices=True))
    with pytest.raises(ValueError, match="average_tokens_across_devices: checkpoint True, now False"):
        checkpoints.check_settings(folder, settings(average_tokens_across_devices=False))


def test_no_checkpoint_to_resume_from_is_one_error(tmp_path):
    with pytest.raises(ValueError, match="holds no checkpoint-\\* folder"):
        checkpoints.resume_checkpoint(tmp_path, True)
    truncate(make_checkpoint(tmp_path, 3) / "model.safetensors")
    with pytest.raises(
        ValueError, match="no checkpoint in .* loads: .*checkpoint-3/model.safetensors is damaged"
    ):
        checkpoints.resume_checkpoint(tmp_path, True)


def test_a_fresh_run_refuses_checkpoints_and_finished_models_or_deletes_them(tmp_path):
    checkpoints.clear_for_fresh_run(tmp_path / "new", overwrite=False, is_main=True)  # nothing there: fine
    (tmp_path / "README.md").write_text("a model card alone is not a model")
    checkpoints.clear_for_fresh_run(tmp_path, overwrite=False, is_main=True)
    save_file({"w": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"already holds a finished model \(model.safetensors\)") as info:
        checkpoints.clear_for_fresh_run(tmp_path, overwrite=False, is_main=True)
    assert "resume_from_checkpoint" not in str(info.value)  # there is nothing to resume
    make_checkpoint(tmp_path, 2)
    with pytest.raises(
        ValueError, match=r"already holds checkpoint-2, a finished model .*resume_from_checkpoint"
    ):
        checkpoints.clear_for_fresh_run(tmp_path, overwrite=False, is_main=True)
    checkpoints.clear_for_fresh_run(tmp_path, overwrite=True, is_main=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "config.json"]


def test_a_failed_save_leaves_no_folder_but_keeps_one_that_existed(tmp_path):
    folder = tmp_path / "checkpoint-4"
    with pytest.raises(KeyboardInterrupt), checkpoints.removed_on_failure(folder, is_main=True):
        folder.mkdir()
        raise KeyboardInterrupt
    assert not folder.exists()
    folder.mkdir()
    with pytest.raises(OSError), checkpoints.removed_on_failure(folder, is_main=True):
        raise OSError(28, "No space left on device")
    assert folder.exists()  # not this save's folder to delete
