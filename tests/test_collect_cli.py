"""``t3d-trl collect``: recipe parsing and a tiny collection from a local jsonl file (offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from testing_utils import add_remote_code, free_port

from t3d_trl import TrajectoryMetadata, load_trajectories
from t3d_trl.cli.collect import CollectConfig, load_source_dataset
from t3d_trl.cli.main import main


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def recipe(tmp_path, tokenizer, block_causal_model):
    teacher = tmp_path / "teacher"
    block_causal_model.save_pretrained(teacher)
    tokenizer.save_pretrained(teacher)
    data = tmp_path / "problems.jsonl"
    rows = [
        {"uid": f"q{i}", "question": q, "gold": str(i)}
        for i, q in enumerate(["1+1", "2*3 = ?", "7-4", "9/3"])
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    values = {
        "model_name_or_path": str(teacher),
        "dataset_name": str(data),
        "prompt_template": "math",
        "prompt_column": "question",
        "id_column": "uid",
        "max_new_tokens": 8,
        "tokens_per_step": 2,
        "batch_size": 4,
        "limit": 3,
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "collect.yaml"
    path.write_text(yaml.safe_dump(values))
    return path, values


def test_collect_runs_a_recipe_and_flags_override(recipe, tokenizer, capsys):
    path, values = recipe
    assert main(["collect", "--config", str(path), "--batch_size", "2"]) == 0
    out = values["output_dir"]
    assert (
        capsys.readouterr().out.splitlines()[-1] == f"3 prompts, 3 trajectories saved to {out}, none dropped"
    )

    dataset = load_trajectories(values["output_dir"])
    metadata = TrajectoryMetadata.from_dataset(dataset)
    assert dataset["id"] == ["q0", "q1", "q2"]  # limit=3, source order
    assert dataset.column_names[-2:] == ["question", "gold"]
    assert "Please reason step by step" in dataset[0]["prompt"]
    assert metadata.teacher == values["model_name_or_path"] and metadata.prompt_template == "math"
    # block-causal model: block length from the model (4), tokens_per_step=2 -> 2 steps per block
    assert (metadata.attention, metadata.block_length, metadata.steps_per_block) == ("block_causal", 4, 2)
    manifest = json.loads((path.parent / "out" / "collection.json").read_text())
    assert manifest["collection"]["batch_size"] == 2  # the flag beat the recipe's 4


def test_unknown_recipe_key_fails(recipe, capsys):
    path, values = recipe
    path.write_text(yaml.safe_dump({**values, "max_new_token": 8}))
    assert main(["collect", "--config", str(path)]) == 2
    assert "max_new_token" in capsys.readouterr().err
    missing = path.with_name("missing.yaml")
    assert main(["collect", "--config", str(missing)]) == 2  # a clear message, not a traceback
    assert f"t3d-trl collect: [Errno 2] No such file or directory: '{missing}'" in capsys.readouterr().err


def test_config_requires_model_dataset_output():
    with pytest.raises(ValueError, match="model_name_or_path, dataset_name, output_dir"):
        CollectConfig()
    for bad in ("bfloat17", "int64"):  # a torch dtype, but no model's weights are cast to it
        with pytest.raises(ValueError, match=f"floating-point torch dtype such as 'bfloat16', got '{bad}'"):
            CollectConfig(model_name_or_path="m", dataset_name="d", output_dir="o", dtype=bad)
    for name, value in (("limit", -3), ("limit", 0), ("batch_size", 0)):  # before the teacher loads
        with pytest.raises(ValueError, match=f"{name} must be a positive number, got {value}"):
            CollectConfig(model_name_or_path="m", dataset_name="d", output_dir="o", **{name: value})
    config = CollectConfig(
        model_name_or_path="m", dataset_name="d", output_dir="o", max_new_tokens=16, block_length=4, steps=8
    )
    generation = config.generation_config()
    assert type(generation).__name__ == "DiffusionGenerationConfig" and generation.resolve(None) == (4, 2)


def test_load_source_dataset_local_files(tmp_path):
    rows = [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": "2"}]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_source_dataset(str(jsonl), split="test").to_list() == rows
    with pytest.raises(ValueError, match="unsupported data file"):
        (tmp_path / "d.txt").write_text("x")
        load_source_dataset(str(tmp_path / "d.txt"))


def test_load_source_dataset_saved_folders(tmp_path):
    import datasets

    train, test = (
        datasets.Dataset.from_list([{"problem": "a"}]),
        datasets.Dataset.from_list([{"problem": "b"}]),
    )
    train.save_to_disk(str(tmp_path / "one"))
    assert load_source_dataset(str(tmp_path / "one")).to_list() == train.to_list()
    with pytest.raises(ValueError, match="one dataset without splits .* not split 'test'"):
        load_source_dataset(str(tmp_path / "one"), split="test")  # it would silently decode the train rows
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "two"))
    assert load_source_dataset(str(tmp_path / "two"), split="test").to_list() == test.to_list()
    with pytest.raises(ValueError, match=r"has splits \['train', 'test'\], not 'validation'"):
        load_source_dataset(str(tmp_path / "two"), split="validation")


def test_a_gold_filter_that_drops_every_row_still_prints_the_summary(recipe, monkeypatch, capsys):
    import t3d_trl.cli.collect as collect_cli

    path, values = recipe
    monkeypatch.setattr(collect_cli, "_math_checker", lambda: lambda completion, gold: False)
    assert main(["collect", "--config", str(path), "--gold_column", "gold"]) == 0
    out = values["output_dir"]
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"3 prompts, 0 trajectories saved to {out}, 3 dropped: 3 answer does not match gold_column='gold'"
    )


def test_push_to_hub_without_hub_access_fails_before_decoding(recipe, monkeypatch, capsys):
    # As `train --push_to_hub` does: the repo is created first, so an offline Hub fails before any decoding.
    import t3d_trl.data.trajectories as trajectories

    path, values = recipe
    decoded = []
    monkeypatch.setattr(trajectories, "collect_trajectories", lambda *a, **k: decoded.append(1))
    assert main(["collect", "--config", str(path), "--push_to_hub", "--hub_model_id", "me/traj"]) != 0
    assert not decoded and not (Path(values["output_dir"])).exists()
    assert "offline" in capsys.readouterr().err.lower()


def test_a_local_teacher_resumes_under_another_spelling_of_its_path(recipe, monkeypatch):
    import t3d_trl.data.trajectories as trajectories

    path, values = recipe
    teacher = values["model_name_or_path"]
    assert main(["collect", "--config", str(path), "--model_name_or_path", teacher + "/"]) == 0
    real, calls = trajectories._generate_batch, []
    monkeypatch.setattr(trajectories, "_generate_batch", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.chdir(path.parent)
    assert main(["collect", "--config", str(path), "--model_name_or_path", "teacher"]) == 0  # relative
    assert not calls  # resumed: the same folder, named another way
    assert TrajectoryMetadata.from_dataset(load_trajectories(values["output_dir"])).teacher == teacher


def test_a_larger_limit_extends_a_finished_collection(recipe, monkeypatch, capsys):
    import t3d_trl.data.trajectories as trajectories

    path, values = recipe
    assert main(["collect", "--config", str(path)]) == 0  # limit 3
    first = load_trajectories(values["output_dir"]).to_list()
    real, calls = trajectories._generate_batch, []
    monkeypatch.setattr(trajectories, "_generate_batch", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert main(["collect", "--config", str(path), "--limit", "4"]) == 0
    out = values["output_dir"]
    assert (
        capsys.readouterr().out.splitlines()[-1] == f"4 prompts, 4 trajectories saved to {out}, none dropped"
    )
    assert len(calls) == 1  # the one new prompt; the first three kept their shard
    extended = load_trajectories(out)
    assert extended["id"] == ["q0", "q1", "q2", "q3"] and extended.to_list()[:3] == first
    assert main(["collect", "--config", str(path), "--limit", "2"]) == 2  # fewer than it holds: refused
    assert "num_prompts: 4 (saved) != 2 (now)" in capsys.readouterr().err


def test_ctrl_c_says_that_rerunning_resumes(recipe, monkeypatch, capsys):
    import t3d_trl.data.trajectories as trajectories

    path, values = recipe
    real, calls = trajectories._generate_batch, []

    def interrupted_on_second_and_third_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) in (2, 3):
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(trajectories, "_generate_batch", interrupted_on_second_and_third_batch)
    # Every process of a launch is interrupted: only the first says so.
    monkeypatch.setenv("RANK", "1")
    assert main(["collect", "--config", str(path), "--batch_size", "1"]) == 130
    assert "interrupted" not in capsys.readouterr().err
    monkeypatch.delenv("RANK")
    try:
        status = main(["collect", "--config", str(path), "--batch_size", "1"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C ended in a traceback")
    assert status != 0
    err = capsys.readouterr().err
    assert "interrupted" in err and "Rerun the same command to resume" in err and values["output_dir"] in err
    assert main(["collect", "--config", str(path), "--batch_size", "1"]) == 0
    assert len(calls) == 3 + 2  # the rerun decoded only the two batches not yet saved
    assert "3 prompts, 3 trajectories saved" in capsys.readouterr().out


def _cli_worker(rank: int, port: int, argv: list[str], log_dir: str) -> None:
    import contextlib
    import os

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    with open(f"{log_dir}/rank{rank}.txt", "w") as log, contextlib.redirect_stdout(log):
        assert main(argv) == 0
    torch.distributed.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.skipif("fork" not in torch.multiprocessing.get_all_start_methods(), reason="needs fork")
def test_two_processes_print_the_final_line_once(recipe, tmp_path):
    path, values = recipe
    port = free_port()
    argv = ["collect", "--config", str(path), "--batch_size", "1"]
    torch.multiprocessing.start_processes(
        _cli_worker, args=(port, argv, str(tmp_path)), nprocs=2, start_method="fork"
    )
    printed = "".join((tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1))
    assert printed.count("trajectories saved") == 1
    assert len(load_trajectories(values["output_dir"])) == 3


def test_trust_remote_code_collects_from_a_teacher_that_ships_its_code(recipe, capsys):
    # The teacher's model and tokenizer classes are its own code (auto_map): both load with the flag only.
    path, values = recipe
    teacher = path.parent / "teacher"
    add_remote_code(teacher, tokenizer=True)
    assert main(["collect", "--config", str(path)]) == 2
    assert "--trust_remote_code" in capsys.readouterr().err
    assert main(["collect", "--config", str(path), "--trust_remote_code"]) == 0
    assert len(load_trajectories(values["output_dir"])) == 3
