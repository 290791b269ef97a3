"""The grid's results (t3d_trl.evaluation.results): model fingerprints, and a rerun that never skips a changed model."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from testing_utils import build_block_causal_model

from t3d_trl.evaluation import results as results_module
from t3d_trl.evaluation import runner
from t3d_trl.evaluation.results import GridResult, model_fingerprint, plan_runs

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def saved_model(tmp_path, tokenizer):
    """A tiny block-causal checkpoint saved with its tokenizer: ``(model, path)``."""
    model = build_block_causal_model(tokenizer, max_position_embeddings=1024)
    path = tmp_path / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model, path


def retrain(model, path) -> None:
    """Save new weights of the same shapes (the header of model.safetensors stays the same) into ``path``."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01)
    model.save_pretrained(path)


def evaluated_benchmarks(monkeypatch) -> list:
    """The benchmark of every run the grid evaluates (with the grid's code extraction rule), recorded."""
    calls = []
    real = runner.evaluate_model

    def recording(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "evaluate_model", recording)
    return calls


def small_grid(path, benchmark: str, benchmark_files, output, **kwargs):
    """One model, one benchmark, one decoding setting of 4 tokens."""
    return runner.run_grid(
        {"m": str(path)},
        [benchmark],
        block_lengths=[4],
        tokens_per_step=[4],
        generation_kwargs={"max_new_tokens": 4},
        data_files={benchmark: benchmark_files[benchmark]},
        output_dir=output,
        progress=False,
        device="cpu",
        **kwargs,
    )


def test_fingerprint_changes_with_weights_and_saved_settings_only(saved_model, monkeypatch):
    model, path = saved_model
    first = model_fingerprint(str(path))
    assert first == model_fingerprint(str(path))  # nothing changed: the same digest
    (path / "checkpoint-1").mkdir()  # a subfolder (a training checkpoint) does not count
    (path / "checkpoint-1" / "model.safetensors").write_bytes(b"x")
    assert model_fingerprint(str(path)) == first
    retrain(model, path)
    second = model_fingerprint(str(path))
    assert second != first
    config = json.loads((path / "config.json").read_text())  # a saved decoding default counts too
    config.setdefault("diffusion_generation", {})["tokens_per_step"] = 2
    (path / "config.json").write_text(json.dumps(config))
    assert model_fingerprint(str(path)) != second


def test_large_weights_are_fingerprinted_by_size_time_and_header(saved_model, monkeypatch):
    # Weights above the size limit are not read whole: an in-place rewrite still shows in the modification time.
    model, path = saved_model
    monkeypatch.setattr(results_module, "_HASHED_WHOLE_BYTES", 1024)
    first = model_fingerprint(str(path))
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # beyond the first MiB read: only the size and time tell
    stat = weights.stat()
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert weights.stat().st_size == stat.st_size
    assert model_fingerprint(str(path)) != first


def test_no_local_copy_has_no_fingerprint():
    assert model_fingerprint("nobody/not-a-cached-model") is None


def test_plan_skips_only_unchanged_models(saved_model, caplog):
    model, path = saved_model
    key = {"model": str(path)}
    entry = {"model": "m", "run_key": key, "model_fingerprint": model_fingerprint(str(path))}
    grid = GridResult(settings={}, results=[entry])
    runs = [("m", "bench", "setting", key)]
    assert plan_runs(grid, {"m": str(path)}, runs, None) == {"m": []}
    retrain(model, path)
    with caplog.at_level(logging.WARNING, logger="t3d_trl"):
        assert plan_runs(grid, {"m": str(path)}, runs, None) == {"m": [("bench", "setting")]}
    assert "model 'm'" in caplog.text and "changed since its results" in caplog.text
    entry.pop(
        "model_fingerprint"
    )  # a results file written before fingerprints: evaluated again, never trusted
    assert plan_runs(grid, {"m": str(path)}, runs, None) == {"m": [("bench", "setting")]}


def test_rerun_evaluates_a_retrained_model_again(saved_model, benchmark_files, tmp_path, monkeypatch, caplog):
    model, path = saved_model
    calls = evaluated_benchmarks(monkeypatch)
    output = tmp_path / "eval"

    def grid():
        return small_grid(path, "gsm8k", benchmark_files, output)

    grid()
    recorded = json.loads((output / "results.json").read_text())["results"][0]["model_fingerprint"]
    assert recorded == model_fingerprint(str(path)) and len(calls) == 1
    with caplog.at_level(logging.INFO, logger="t3d_trl"):
        grid()
    assert len(calls) == 1 and "skipping 1 run(s) already finished" in caplog.text
    caplog.clear()

    retrain(model, path)
    with caplog.at_level(logging.INFO, logger="t3d_trl"):
        grid()
    assert len(calls) == 2  # evaluated again, not skipped
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        "model 'm'" in warning.getMessage()
        and "evaluating its 1 finished run(s) again" in warning.getMessage()
    )
    assert "skipping" not in caplog.text
    (entry,) = json.loads((output / "results.json").read_text())["results"]  # replaced, not duplicated
    assert entry["model_fingerprint"] == model_fingerprint(str(path)) != recorded


def test_rerun_with_another_code_extraction_rule_evaluates_again(
    saved_model, benchmark_files, tmp_path, monkeypatch
):
    _, path = saved_model
    calls = evaluated_benchmarks(monkeypatch)

    def grid(rule):
        return small_grid(path, "mbpp", benchmark_files, tmp_path / "eval", code_extraction=rule)

    grid(None)
    grid("entry_point")  # the default rule, named: the same runs
    assert len(calls) == 1
    grid("last_block")  # another rule: the scores would differ, so the run is evaluated again
    grid("last_block")
    assert [benchmark.code_extraction for benchmark in calls] == ["entry_point", "last_block"]
    (entry,) = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert entry["run_key"]["code_extraction"] == "last_block"
    with pytest.raises(ValueError, match="code_extraction must be one of"):
        grid("lastblock")


def test_a_rerun_with_a_new_first_model_makes_it_the_baseline(saved_model, benchmark_files, tmp_path):
    # `--models` names the Gain column's baseline first; a model added in front by a rerun into the same folder
    # becomes it, though the other model's results were on disk first.
    _, path = saved_model
    output = tmp_path / "eval"
    grid = {"block_lengths": [4], "tokens_per_step": [4], "generation_kwargs": {"max_new_tokens": 4}}
    common = {"data_files": {"gsm8k": benchmark_files["gsm8k"]}, "output_dir": output, "progress": False}
    runner.run_grid({"t3d": str(path)}, ["gsm8k"], device="cpu", **grid, **common)
    merged = runner.run_grid(
        {"original": str(path), "t3d": str(path)}, ["gsm8k"], device="cpu", **grid, **common
    )
    assert list(merged.settings["models"]) == ["original", "t3d"]
    assert [e["model"] for e in merged.results] == ["original", "t3d"]
    written = json.loads((output / "results.json").read_text())
    assert [e["model"] for e in written["results"]] == ["original", "t3d"]
    table = (output / "table.md").read_text()
    assert table.index("| original |") < table.index("| t3d |")
    assert "| original | " in table and table.split("| original |")[1].split("\n")[0].rstrip().endswith(
        "| - |"
    )


def test_merged_model_order():
    # This grid's models take the place of the first of them among the earlier ones; the others keep theirs.
    def order(old, new):
        def grid(names):
            return GridResult(
                {"models": dict.fromkeys(names, "p"), "benchmarks": [], "decoding": [], "data_files": {}}, []
            )

        return list(results_module.merge_settings(grid(old), grid(new)).settings["models"])

    assert order(["t3d"], ["original", "t3d"]) == ["original", "t3d"]
    assert order(["a", "b"], ["b"]) == order(["a", "b"], ["a"]) == ["a", "b"]
    assert order(["a", "b"], ["c"]) == ["a", "b", "c"]
    assert order(["a", "x", "b"], ["b", "a"]) == ["b", "a", "x"]
