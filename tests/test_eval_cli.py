"""``t3d-trl eval`` end to end on tiny saved models and local benchmark files, and ``t3d-trl generate``."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import build_bidirectional_model, build_block_causal_model, build_tokenizer

from t3d_trl.cli.eval import EvalConfig
from t3d_trl.cli.main import main
from t3d_trl.data.prompts import format_user_message
from t3d_trl.evaluation.runner import generate_completions, load_model

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    """Two tiny checkpoints saved with their tokenizer, loadable by path like any Hub model."""
    tokenizer = build_tokenizer()
    paths = {}
    for name, build in (("sdar-like", build_block_causal_model), ("llada-like", build_bidirectional_model)):
        path = tmp_path_factory.mktemp(name)
        build(tokenizer, max_position_embeddings=1024).save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths[name] = str(path)
    return paths


def test_eval_grid_end_to_end(saved_models, benchmark_files, tmp_path, capsys):
    output = tmp_path / "eval"
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "models": [f"original={saved_models['sdar-like']}", saved_models["llada-like"]],
                "benchmarks": ["math500", "gsm8k", "mbpp", "humaneval"],
                "data_files": [f"{name}={path}" for name, path in benchmark_files.items()],
                "block_lengths": [4],
                "tokens_per_step": [2, 4],
                "thresholds": [0.9],
                "max_new_tokens": 8,
                "limit": 5,
                "output_dir": str(output),
            }
        )
    )
    assert main(["eval", "--config", str(recipe), "--batch_size", "2"]) == 0
    stdout = capsys.readouterr().out

    saved = json.loads((output / "results.json").read_text())
    second = (
        saved_models["llada-like"].rstrip("/").rsplit("/", 1)[-1]
    )  # a bare path is named after its folder
    assert list(saved["settings"]["models"]) == ["original", second]
    assert saved["settings"]["batch_size"] == 2 and saved["settings"]["generation_kwargs"] == {
        "max_new_tokens": 8
    }
    results = saved["results"]
    labels = ["block4-tokps2", "block4-tokps4", "block4-threshold0.9"]
    assert [(e["model"], e["benchmark"], e["setting"]["label"]) for e in results] == [
        (model, bench, label)
        for model in ("original", second)
        for bench in ("MATH500", "GSM8K", "MBPP", "HumanEval")
        for label in labels
    ]
    for entry in results:
        metrics = entry["metrics"]
        samples = [json.loads(line) for line in (output / entry["samples_file"]).read_text().splitlines()]
        assert len(samples) == metrics["num_samples"] == 2  # both fixture rows (limit 5)
        assert metrics["accuracy"] == sum(s["correct"] for s in samples) / 2
        assert metrics["mean_output_length"] == sum(s["num_tokens"] for s in samples) / 2 <= 8
        assert metrics["tokens_per_second"] > 0 and metrics["mean_nfe"] >= 1
        assert entry["generation_config"]["max_new_tokens"] == 8
        assert entry["generation_config"]["threshold"] == entry["setting"]["threshold"]

    table = (output / "table.md").read_text()
    section = table.split("### TokPS = 4\n\n")[1].split("\n\n")[0].splitlines()
    assert (
        section[0]
        == "| Method | MATH500 (B=4) | GSM8K (B=4) | MBPP (B=4) | HumanEval (B=4) | AVG | Gain (%) |"
    )
    for line, model in zip(section[2:], ("original", second)):
        cells = [c.strip() for c in line.strip("|").split("|")]
        runs = [e for e in results if e["model"] == model and e["setting"]["label"] == "block4-tokps4"]
        assert cells[0] == model
        assert cells[1:5] == [f"{100 * e['metrics']['accuracy']:.2f}" for e in runs]
    assert "### Dynamic decoding, threshold 0.9" in table
    assert table.split("### TokPS = 4")[1].split("##")[0].strip() in stdout
    for plot in ("accuracy_vs_tokps.png", "accuracy_vs_throughput.png"):
        assert (output / plot).read_bytes()[:8] == PNG_SIGNATURE


def test_eval_config_parsing(tmp_path, capsys):
    config = EvalConfig(models=["base=org/model", "/ckpt/t3d-run/"], data_files=["gsm8k=/data/gsm8k.jsonl"])
    assert config.model_paths() == {"base": "org/model", "t3d-run": "/ckpt/t3d-run/"}
    assert config.data_file_paths() == {"gsm8k": "/data/gsm8k.jsonl"}
    assert config.generation_kwargs() == {}
    with pytest.raises(ValueError, match="NAME=PATH, got 'gsm8k.jsonl'"):
        EvalConfig(models=["m"], data_files=["gsm8k.jsonl"]).data_file_paths()
    with pytest.raises(ValueError, match="'m' appears twice"):
        EvalConfig(models=["m=a", "m=b"]).model_paths()
    with pytest.raises(ValueError, match="at least one model"):
        EvalConfig()
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(yaml.safe_dump({"models": ["m"], "block_size": [4]}))
    assert main(["eval", "--config", str(recipe)]) == 2
    assert "block_size" in capsys.readouterr().err


def test_generate_prints_the_completion(saved_models, capsys):
    path = saved_models["sdar-like"]
    argv = ["generate", "--model", path, "--prompt", "What is 2+2?", "--template", "math"]
    assert main([*argv, "--max_new_tokens", "8", "--tokens_per_step", "2", "--verbose"]) == 0
    captured = capsys.readouterr()
    model, tokenizer = load_model(path)
    config = model.diffusion_generation_config.update(max_new_tokens=8, tokens_per_step=2)
    message = format_user_message("math", {"problem": "What is 2+2?"})
    expected = generate_completions(model, tokenizer, [message], config, progress=False)
    assert captured.out == expected.completions[0] + "\n"
    assert f"nfe={expected.nfe[0]} tokens={expected.num_tokens[0]}" in captured.err
    assert "tokens/s=" in captured.err

    with pytest.raises(ValueError, match="dtype must be 'auto' or a torch dtype name.*'float99'"):
        load_model(path, dtype="float99")
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--steps", "4", "--tokens_per_step", "2"])
    assert exit_info.value.code == 2
    assert "not both" in capsys.readouterr().err


def test_generate_and_eval_take_the_cache_setting(saved_models, capsys):
    path = saved_models["llada-like"]
    argv = ["generate", "--model", path, "--prompt", "What is 2+2?", "--max_new_tokens", "8"]
    argv += ["--block_length", "4", "--tokens_per_step", "1", "--schedule", "sdar"]
    assert main([*argv, "--cache", "dual"]) == 0
    model, tokenizer = load_model(path)
    config = model.diffusion_generation_config.update(
        max_new_tokens=8, block_length=4, tokens_per_step=1, schedule="sdar", cache="dual"
    )
    message = format_user_message("plain", {"problem": "What is 2+2?"})
    expected = generate_completions(model, tokenizer, [message], config, progress=False)
    assert capsys.readouterr().out == expected.completions[0] + "\n"
    with pytest.raises(SystemExit):
        main([*argv, "--cache", "full"])
    assert "invalid choice: 'full'" in capsys.readouterr().err
    # A block-causal model has its exact cache: the approximate one is refused with the reason.
    causal = ["generate", "--model", saved_models["sdar-like"], "--prompt", "hi", "--cache", "prefix"]
    with pytest.raises(ValueError, match="block-causal models decode with their exact block cache"):
        main([*causal, "--max_new_tokens", "8"])
    assert EvalConfig(models=["m"], cache="dual", schedule="dream").generation_kwargs() == {
        "cache": "dual",
        "schedule": "dream",
    }
