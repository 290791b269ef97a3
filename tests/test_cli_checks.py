"""Inputs checked before anything loads: one line, exit status 2, no traceback (``--debug`` shows it)."""

from __future__ import annotations

import importlib.util

import pytest

from t3d_trl.cli.main import main

TEACHER = "t3d_trl/demo/teachers/wordsort"


def one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("t3d-trl ")]
    assert len(lines) == 1 and lines[0].startswith(f"t3d-trl {command}: "), err
    assert "Traceback" not in err
    return lines[0]


def train(tmp_path, *argv: str) -> int:
    return main(["train", "--output_dir", str(tmp_path / "out"), "--accelerate_config", "", *argv])


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("t3d_trl/demo/teacher/wordsort", "no such folder (nor a valid Hub repo id)"),  # a mistyped folder
        (
            "wordsort-teacher",
            "offline (HF_HUB_OFFLINE=1) the Hub repo 'wordsort-teacher' is not in the local cache",
        ),
    ],
)
def test_train_checks_its_model_before_loading_anything(tmp_path, capsys, model, message):
    trajectories = tmp_path / "trajectories"
    trajectories.mkdir()
    assert train(tmp_path, "--model_name_or_path", model, "--dataset_name", str(trajectories)) == 2
    assert message in one_line(capsys, "train")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ("./trajectoriez", "'./trajectoriez' is no file or folder"),
        ("missing.jsonl", "data file 'missing.jsonl' does not exist"),
        (
            "Gen-Verse/MATH_trainn",
            "offline (HF_HUB_OFFLINE=1) the Hub dataset 'Gen-Verse/MATH_trainn' is not in",
        ),
    ],
)
def test_train_and_collect_check_their_dataset_before_loading_anything(tmp_path, capsys, dataset, message):
    assert train(tmp_path, "--model_name_or_path", TEACHER, "--dataset_name", dataset) == 2
    assert message in one_line(capsys, "train")
    argv = ["collect", "--model_name_or_path", TEACHER, "--dataset_name", dataset]
    assert main([*argv, "--output_dir", str(tmp_path / "c"), "--prompt_column", "prompt"]) == 2
    assert message in one_line(capsys, "collect")
    assert not (tmp_path / "c").exists()


def test_collect_checks_its_teacher_before_reading_the_data(tmp_path, capsys):
    data = tmp_path / "p.jsonl"
    data.write_text('{"problem": "x"}\n')
    argv = ["collect", "--model_name_or_path", "./teachr", "--dataset_name", str(data)]
    assert main([*argv, "--output_dir", str(tmp_path / "c")]) == 2
    assert "model './teachr': no such folder" in one_line(capsys, "collect")


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="DeepSpeed is installed here")
def test_deepspeed_config_without_deepspeed_is_one_line_naming_config_and_package(tmp_path, capsys):
    argv = ["train", "--model_name_or_path", TEACHER, "--dataset_name", str(tmp_path)]
    argv += ["--output_dir", str(tmp_path / "out"), "--accelerate_config", "recipes/accelerate/zero2.yaml"]
    assert main(argv) == 2
    line = one_line(capsys, "train")
    assert "accelerate_config 'recipes/accelerate/zero2.yaml' runs DeepSpeed" in line
    assert "'deepspeed' is not installed" in line and "--accelerate_config ''" in line
    assert main([*argv, "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err  # --debug still shows where it came from


def test_fsdp_config_without_torch_distributed_is_refused(tmp_path, capsys, monkeypatch):
    import torch.distributed

    monkeypatch.setattr(torch.distributed, "is_available", lambda: False)
    argv = ["train", "--model_name_or_path", TEACHER, "--dataset_name", str(tmp_path)]
    argv += ["--output_dir", str(tmp_path / "out"), "--accelerate_config", "recipes/accelerate/fsdp.yaml"]
    assert main(argv) == 2
    line = one_line(capsys, "train")
    assert "'recipes/accelerate/fsdp.yaml' runs FSDP" in line and "torch.distributed" in line
