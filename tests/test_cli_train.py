"""``t3d-trl train``: the recipe-driven run, relaunched over two CPU processes, matches the Python API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from datasets import DatasetDict
from testing_utils import add_remote_code, build_bidirectional_model, build_trajectories, free_port

from t3d_trl import DiffusionGenerationConfig
from t3d_trl.cli.main import main
from t3d_trl.trainer import T3DConfig, T3DTrainer

PROMPTS = ["hello", "what is 2+2", "abc", "the cat sat"]
SETTINGS = dict(
    max_steps=1,
    learning_rate=1e-2,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    activation_checkpointing=False,
    disable_tqdm=True,
    use_cpu=True,
)


@pytest.fixture
def files(tokenizer, tmp_path):
    """A tiny saved student and a trajectory dataset saved the way ``t3d-trl collect`` saves it."""
    model_dir, data_dir = tmp_path / "model", tmp_path / "trajectories"
    build_bidirectional_model(tokenizer, seed=1).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    build_trajectories(build_bidirectional_model(tokenizer, seed=1), tokenizer, PROMPTS).save_to_disk(
        data_dir
    )
    return model_dir, data_dir


def write_yaml(path: Path, values: dict) -> str:
    path.write_text(yaml.safe_dump(values))
    return str(path)


def launch_recipe(files, tmp_path: Path, name: str, launcher: dict, **settings) -> str:
    """A train recipe on ``files`` (2 rows per process) run under the accelerate config ``launcher``."""
    model_dir, data_dir = files
    recipe = {
        "model_name_or_path": str(model_dir),
        "dataset_name": str(data_dir),
        "output_dir": str(tmp_path / name),
        "per_device_train_batch_size": 2,
        "accelerate_config": write_yaml(tmp_path / f"{name}-accelerate.yaml", launcher),
        **SETTINGS,
        **settings,
    }
    return write_yaml(tmp_path / f"{name}.yaml", recipe)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_process_cli_run_matches_the_one_process_python_api(tokenizer, files, tmp_path, capfd):
    from t3d_trl import load_trajectories

    model_dir, data_dir = files
    # An evaluation split of 3 rows: over 2 processes of 2 rows, accelerate repeats row 0 to fill the last batch.
    data = load_trajectories(str(data_dir))
    split_dir = tmp_path / "splits"
    DatasetDict({"train": data, "test": data.select(range(3))}).save_to_disk(split_dir)
    evaluation = dict(eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=2)
    # One process, Python API, batch of 4.
    single = T3DTrainer(
        build_bidirectional_model(tokenizer, seed=1),
        T3DConfig(
            output_dir=str(tmp_path / "single"), per_device_train_batch_size=4, **evaluation, **SETTINGS
        ),
        train_dataset=data,
        eval_dataset=data.select(range(3)),
        processing_class=tokenizer,
    )
    single.train()
    expected, expected_eval = single.state.log_history[:2]

    # Two processes (gloo on the CPU), 2 rows each, launched by the command itself. `accelerate launch --cpu` starts
    # one process (multi-CPU wants MPI); a MULTI_GPU config starts torchrun workers, which run on the CPU here.
    launcher = {"distributed_type": "MULTI_GPU", "num_processes": 2, "num_machines": 1, "machine_rank": 0}
    launcher["main_process_port"] = free_port()
    launcher.update(
        {"mixed_precision": "no", "dynamo_backend": "NO", "gpu_ids": "all", "main_training_function": "main"}
    )
    # No use_cpu: torchrun workers on a machine without GPUs train together on the CPU (accelerate alone would
    # make each a separate one-process run: 2 copies, epoch 0.5 per step).
    settings = {} if torch.accelerator.is_available() else {"use_cpu": False}
    capfd.readouterr()
    recipe = launch_recipe(
        (model_dir, split_dir), tmp_path, "cli", launcher, eval_split="test", **evaluation, **settings
    )
    assert main(["train", "--config", recipe]) == 0
    captured = capfd.readouterr()
    assert captured.out.count("model saved to") == 1  # not once per process
    assert "FutureWarning" not in captured.err and "pin_memory" not in captured.err
    assert "find_unused_parameters" not in captured.err  # every parameter is used: DDP need not search

    out = tmp_path / "cli"
    log, log_eval = json.loads((out / "trainer_state.json").read_text())["log_history"][:2]
    assert log["epoch"] == 1.0  # 2 processes x 2 rows: one step covers the 4 rows (one process would do 0.5)
    assert log["loss"] == pytest.approx(expected["loss"], rel=1e-4)
    assert log["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)
    # The evaluation counts each of the 3 rows once, as one process does (not the repeated row 0 twice).
    scores = {
        k: v
        for k, v in expected_eval.items()
        if k.startswith("eval_") and not k.endswith(("runtime", "second"))
    }
    assert {"eval_loss", "eval_loss/ddo", "eval_masked_token_accuracy"} <= set(scores)
    assert {k: log_eval[k] for k in scores} == pytest.approx(scores, rel=1e-4)
    saved = json.loads((out / "config.json").read_text())
    assert DiffusionGenerationConfig.from_dict(saved["diffusion_generation"]).tokens_per_step == 2
    assert "- t3d" in (out / "README.md").read_text()


def one_process_recipe(files, tmp_path, **overrides) -> dict:
    model_dir, data_dir = files
    recipe = {
        "model_name_or_path": str(model_dir),
        "dataset_name": str(data_dir),
        "output_dir": str(tmp_path / "o"),
    }
    return {**recipe, **SETTINGS, "per_device_train_batch_size": 4, **overrides}


def test_flags_override_the_recipe_and_bad_recipes_exit_2(files, tmp_path, capsys):
    recipe = one_process_recipe(files, tmp_path, loss_type="td")
    path = write_yaml(tmp_path / "recipe.yaml", recipe)
    assert main(["train", "--config", path, "--max_steps", "2"]) == 0
    state = json.loads((tmp_path / "o" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and "loss/td" in state["log_history"][0]

    assert main(["train", "--config", write_yaml(tmp_path / "bad.yaml", {**recipe, "betta": 0.2})]) == 2
    assert "betta" in capsys.readouterr().err
    # A recipe value is read as its flag's would be: a wrong type or choice is one line, before anything runs.
    for key, value, message in [
        ("max_steps", 2.5, "recipe key max_steps: invalid value 2.5"),
        ("dtype", "float33", "recipe key dtype: invalid choice 'float33' (choose from"),
        ("save_strategy", False, "YAML reads an unquoted no/yes/on/off as a boolean: quote it"),
    ]:
        bad = write_yaml(tmp_path / "typed.yaml", {**recipe, key: value})
        assert message in failure(["train", "--config", bad], capsys)
        assert message in failure(["train", f"--config={bad}"], capsys)  # the `=` form reads the same recipe
    message = failure(["train", "--config", path, "--config", path], capsys)
    assert "--config is given twice" in message
    # A folder written by collect has no splits: its rows would be the evaluation rows too.
    message = failure(["train", "--config", path, "--eval_split", "test", "--eval_strategy", "steps"], capsys)
    assert "eval_split 'test'" in message and "one dataset without splits" in message
    del recipe["dataset_name"]
    assert main(["train", "--config", write_yaml(tmp_path / "none.yaml", recipe)]) == 2
    assert "dataset_name" in capsys.readouterr().err


def test_fsdp_on_cpu_processes_is_refused_before_the_launch(files, tmp_path, capfd):
    # The FSDP config switched to the CPU (issue 15): accelerate cannot shard CPU processes. Before, both processes
    # trained their own copy and both saved; the trainer refuses that launch (tests/test_trainer.py), and the
    # command refuses the config before it starts any process, in one line.
    launcher = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "recipes/accelerate/fsdp.yaml").read_text()
    )
    launcher.update(use_cpu=True, num_processes=2, mixed_precision="no", main_process_port=free_port())
    assert main(["train", "--config", launch_recipe(files, tmp_path, "fsdp", launcher)]) == 2
    err = capfd.readouterr().err
    assert "runs FSDP, which accelerate sets up on GPUs only" in err and "Traceback" not in err
    assert not (tmp_path / "fsdp").exists()


def test_an_output_dir_a_run_would_refuse_is_refused_before_the_launch(files, tmp_path, capsys, monkeypatch):
    # Before, every launched process printed the refusal, then the launcher its traceback, with exit status 1.
    import t3d_trl.cli.train as train_cli

    path = write_yaml(
        tmp_path / "recipe.yaml", one_process_recipe(files, tmp_path, save_strategy="steps", save_steps=1)
    )
    assert main(["train", "--config", path, "--max_steps", "1"]) == 0
    monkeypatch.setattr(
        train_cli, "_relaunch", lambda *a: pytest.fail("launched processes to refuse the folder")
    )
    launcher = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "recipes/accelerate/ddp.yaml").read_text()
    )
    launch = ["--accelerate_config", write_yaml(tmp_path / "ddp.yaml", {**launcher, "use_cpu": True})]
    assert "already holds checkpoint-1, a finished model" in failure(
        ["train", "--config", path, *launch], capsys
    )
    message = failure(
        ["train", "--config", path, *launch, "--max_steps", "1", "--resume_from_checkpoint", "true"], capsys
    )
    assert "checkpoint-1 is at step 1 and max_steps is 1: the run is finished" in message


def failure(argv: list[str], capsys) -> str:
    """The one-line message of a command that fails with an expected error."""
    assert main(argv) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_rerun_resumes_or_refuses_and_leaves_no_cache_files(files, tmp_path, capsys):
    recipe = one_process_recipe(files, tmp_path, save_strategy="steps", save_steps=1)
    path = write_yaml(tmp_path / "recipe.yaml", recipe)
    assert main(["train", "--config", path]) == 0
    assert not list(files[1].glob("cache-*"))  # the trajectory folder holds only the dataset

    message = failure(["train", "--config", path, "--max_steps", "2"], capsys)
    assert "already holds checkpoint-1" in message and "--resume_from_checkpoint true" in message
    assert "\n" not in message.strip()
    assert main(["train", "--config", path, "--max_steps", "2", "--resume_from_checkpoint", "true"]) == 0
    state = json.loads((tmp_path / "o" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    # Resumed again, a finished run is refused: transformers would train a third step over the finished model.
    weights = (tmp_path / "o" / "model.safetensors").read_bytes()
    message = failure(
        ["train", "--config", path, "--max_steps", "2", "--resume_from_checkpoint", "true"], capsys
    )
    assert "checkpoint-2 is at step 2 and max_steps is 2: the run is finished" in message
    assert (tmp_path / "o" / "model.safetensors").read_bytes() == weights
    assert not (tmp_path / "o" / "checkpoint-3").exists()
    assert main(["train", "--config", path, "--overwrite_output_dir", "true"]) == 0
    assert sorted(p.name for p in (tmp_path / "o").glob("checkpoint-*")) == ["checkpoint-1"]


def test_lora_training_and_adapter_loading_raise_no_deprecation_warning(files, tmp_path):
    # peft and TRL read transformers' deprecated is_gradient_checkpointing inside our calls (get_peft_model, the
    # reference adapter's disable_gradient_checkpointing, PeftModel.from_pretrained): nothing a user can act on.
    import warnings

    from t3d_trl.evaluation.runner import load_model

    model_dir, data_dir = files
    argv = ["train", "--model_name_or_path", str(model_dir), "--dataset_name", str(data_dir)]
    argv += [
        "--output_dir",
        str(tmp_path / "lora"),
        "--use_peft",
        "true",
        "--lora_r",
        "4",
        "--loss_type",
        "t3d",
    ]
    argv += ["--per_device_train_batch_size", "2"]
    for key, value in SETTINGS.items():
        argv += [f"--{key}", str(value)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(argv) == 0
        load_model(str(tmp_path / "lora"), device="cpu")
    assert not [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def test_resume_skips_a_checkpoint_with_damaged_weights(files, tmp_path, capsys, caplog, monkeypatch):
    recipe = one_process_recipe(files, tmp_path, save_strategy="steps", save_steps=3, max_steps=6)
    recipe["per_device_train_batch_size"] = 2
    path = write_yaml(tmp_path / "recipe.yaml", recipe)
    assert main(["train", "--config", path]) == 0
    out = tmp_path / "o"
    damaged = out / "checkpoint-6" / "model.safetensors"
    with open(damaged, "r+b") as f:  # a crash or a partial copy
        f.truncate(100)
    resume = ["train", "--config", path, "--max_steps", "7", "--resume_from_checkpoint", "true"]
    steps = []
    real = T3DTrainer.compute_loss
    monkeypatch.setattr(
        T3DTrainer, "compute_loss", lambda self, *a, **k: steps.append(1) or real(self, *a, **k)
    )
    with caplog.at_level("WARNING"):
        assert main(resume) == 0
    assert f"not resuming from checkpoint-6: {damaged} is damaged" in caplog.text
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 7
    assert len(steps) == 4  # steps 4-7: resumed from checkpoint-3, the last checkpoint that loads
    monkeypatch.undo()

    for checkpoint in out.glob("checkpoint-*"):
        with open(checkpoint / "model.safetensors", "r+b") as f:
            f.truncate(100)
    message = failure(resume, capsys)
    assert message.startswith("t3d-trl train: resume_from_checkpoint=True but no checkpoint in")
    assert "checkpoint-3/model.safetensors is damaged" in message


def test_train_into_a_folder_holding_a_finished_model_is_refused(files, tmp_path, capsys):
    path = write_yaml(tmp_path / "recipe.yaml", one_process_recipe(files, tmp_path))  # save_strategy: no
    assert main(["train", "--config", path]) == 0
    weights = (tmp_path / "o" / "model.safetensors").read_bytes()
    message = failure(["train", "--config", path, "--learning_rate", "0.5"], capsys)
    assert "already holds a finished model (model.safetensors)" in message
    assert "--overwrite_output_dir true" in message and "--resume_from_checkpoint" not in message
    assert (tmp_path / "o" / "model.safetensors").read_bytes() == weights  # untouched
    assert main(["train", "--config", path, "--learning_rate", "0.5", "--overwrite_output_dir", "true"]) == 0
    assert (tmp_path / "o" / "model.safetensors").read_bytes() != weights


def test_a_truncated_trajectory_file_is_named_in_one_line(files, tmp_path, capsys):
    model_dir, data_dir = files
    [arrow] = data_dir.glob("*.arrow")
    with open(arrow, "r+b") as f:
        f.truncate(arrow.stat().st_size // 2)
    path = write_yaml(tmp_path / "recipe.yaml", one_process_recipe(files, tmp_path))
    message = failure(["train", "--config", path], capsys)
    assert message.startswith(f"t3d-trl train: {data_dir}: {arrow.name} is damaged")
    assert "no shards to rebuild it from" in message  # saved with save_to_disk, not collected here


def test_a_logger_that_is_not_installed_is_refused_before_loading(files, tmp_path, capsys, monkeypatch):
    import transformers.integrations

    monkeypatch.setattr(
        transformers.integrations, "get_available_reporting_integrations", lambda: ["tensorboard"]
    )
    path = write_yaml(tmp_path / "recipe.yaml", one_process_recipe(files, tmp_path))
    message = failure(["train", "--config", path, "--report_to", "wandb"], capsys)
    assert "report_to ['wandb']: not installed (pip install wandb)" in message
    assert not (tmp_path / "o").exists()


def _argv(model: str, data_dir: Path, output_dir: Path, *extra: str) -> list[str]:
    argv = ["train", "--model_name_or_path", model, "--dataset_name", str(data_dir)]
    argv += ["--output_dir", str(output_dir), "--per_device_train_batch_size", "4", *extra]
    for key, value in SETTINGS.items():
        argv += [f"--{key}", str(value)]
    return argv


def test_a_lora_adapter_records_the_base_revision_it_was_trained_on(files, tokenizer, tmp_path, monkeypatch):
    # adapter_config.json's "revision" is where peft (and AutoModelForDiffusionLM) load the base model again:
    # without it, an adapter trained on the base's v1 loads on its main branch, silently.
    import shutil

    from huggingface_hub import constants

    from t3d_trl import AutoModelForDiffusionLM

    model_dir, data_dir = files
    build_bidirectional_model(tokenizer, seed=0).save_pretrained(tmp_path / "main")
    tokenizer.save_pretrained(tmp_path / "main")
    repo = tmp_path / "hub" / "models--me--base"
    for revision, commit, folder in (("main", "a" * 40, tmp_path / "main"), ("v1", "b" * 40, model_dir)):
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / revision).write_text(commit)
        shutil.copytree(folder, repo / "snapshots" / commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    out = tmp_path / "lora"
    argv = _argv("me/base", data_dir, out, "--model_revision", "v1", "--use_peft", "--lora_r", "4")
    assert main(argv) == 0
    saved = json.loads((out / "adapter_config.json").read_text())
    assert (saved["base_model_name_or_path"], saved["revision"]) == ("me/base", "v1")
    loaded = AutoModelForDiffusionLM.from_pretrained(str(out))
    trained_on = AutoModelForDiffusionLM.from_pretrained(str(model_dir))
    assert torch.equal(loaded.get_input_embeddings().weight, trained_on.get_input_embeddings().weight)


def test_trust_remote_code_trains_a_checkpoint_that_ships_its_code(files, tmp_path, capsys):
    model_dir, data_dir = files
    add_remote_code(model_dir)
    assert "--trust_remote_code" in failure(_argv(str(model_dir), data_dir, tmp_path / "refused"), capsys)
    assert main(_argv(str(model_dir), data_dir, tmp_path / "o", "--trust_remote_code")) == 0
    saved = json.loads((tmp_path / "o" / "config.json").read_text())
    assert saved["architectures"] == ["MyModel"] and (tmp_path / "o" / "modeling_my.py").is_file()
    # generate and eval load it the same way (through evaluation.runner.load_model).
    generate = ["generate", "--model", str(tmp_path / "o"), "--prompt", "ab", "--max_new_tokens", "4"]
    assert "--trust_remote_code" in failure(generate, capsys)
    assert main([*generate, "--trust_remote_code"]) == 0


@pytest.mark.parametrize("flag", ["--load_in_4bit", "--load_in_8bit"])
def test_quantized_loading_is_refused_before_anything_loads(files, tmp_path, capsys, flag):
    # TRL's ModelConfig parses them, but nothing here loads a quantized model: it would train in full precision.
    model_dir, data_dir = files
    message = failure(_argv(str(model_dir), data_dir, tmp_path / "o", flag), capsys)
    assert f"{flag}: not supported by t3d-trl train yet" in message
    assert not (tmp_path / "o").exists()


def test_one_lora_target_module_is_a_module_name_not_a_regex(files, tmp_path):
    # TRL's ModelConfig makes [q_proj] the string "q_proj", which peft matches against full module names only.
    model_dir, data_dir = files
    peft = ("--use_peft", "--lora_r", "4", "--lora_target_modules", "q_proj")
    assert main(_argv(str(model_dir), data_dir, tmp_path / "o", *peft)) == 0
    saved = json.loads((tmp_path / "o" / "adapter_config.json").read_text())
    assert saved["target_modules"] == ["q_proj"]


def test_an_adapter_of_a_relative_base_path_loads_from_another_directory(files, tmp_path, monkeypatch):
    from t3d_trl import AutoModelForDiffusionLM

    model_dir, data_dir = files
    monkeypatch.chdir(tmp_path)
    assert main(_argv("model", data_dir, tmp_path / "o", "--use_peft", "--lora_r", "4")) == 0
    saved = json.loads((tmp_path / "o" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(model_dir)
    card = (tmp_path / "o" / "README.md").read_text()
    assert str(model_dir) not in card and "base_model:" not in card  # local paths stay off the card
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    AutoModelForDiffusionLM.from_pretrained(str(tmp_path / "o"))


def test_lora_on_an_encoder_mlm_trains_and_reloads(tokenizer, files, tmp_path):
    # TRL's default lora_task_type CAUSAL_LM makes a PeftModelForCausalLM, which an encoder MLM cannot back.
    from testing_utils import build_modernbert_model

    from t3d_trl import AutoModelForDiffusionLM

    _, data_dir = files
    build_modernbert_model(tokenizer).save_pretrained(tmp_path / "mlm")
    tokenizer.save_pretrained(tmp_path / "mlm")
    peft = ("--use_peft", "--lora_r", "4", "--lora_target_modules", "Wqkv", "Wo")
    assert main(_argv(str(tmp_path / "mlm"), data_dir, tmp_path / "o", *peft)) == 0
    assert json.loads((tmp_path / "o" / "adapter_config.json").read_text())["task_type"] is None
    loaded = AutoModelForDiffusionLM.from_pretrained(str(tmp_path / "o"))
    assert type(loaded.get_base_model()).__name__.startswith("ModernBertForMaskedLM")
