"""``t3d-trl eval`` end to end on tiny saved models and local benchmark files, and ``t3d-trl generate``."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from testing_utils import (
    build_bidirectional_model,
    build_block_causal_model,
    build_tokenizer,
    registered_benchmark,
)

from t3d_trl.cli.eval import EvalConfig, EvalDecodingConfig
from t3d_trl.cli.main import main
from t3d_trl.data.prompts import format_user_message
from t3d_trl.demo.quickstart import PACKAGED_TEACHERS
from t3d_trl.evaluation.benchmarks import Benchmark
from t3d_trl.evaluation.completions import generate_completions
from t3d_trl.evaluation.grid import GRID_FIELDS
from t3d_trl.evaluation.runner import load_model
from t3d_trl.generation.configuration import DiffusionGenerationConfig
from t3d_trl.models.auto import saved_decoding_defaults

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
    # The grid's own fields (refused in run_grid's generation_kwargs) only reach the grid's lists.
    grid = EvalConfig(models=["m"], block_lengths=[8], tokens_per_step=[2], steps=[4], thresholds=[0.9])
    assert grid.generation_kwargs() == {} and not set(GRID_FIELDS) & {
        f.name for f in fields(EvalDecodingConfig)
    }
    with pytest.raises(ValueError, match="NAME=PATH, got 'gsm8k.jsonl'"):
        EvalConfig(models=["m"], data_files=["gsm8k.jsonl"]).data_file_paths()
    with pytest.raises(ValueError, match="'m' appears twice"):
        EvalConfig(models=["m=a", "m=b"]).model_paths()
    # A folder named like a sweep's (`lr=1e-4`) is a path, not NAME=PATH, whether it exists yet or not.
    (tmp_path / "lr=1e-4" / "run").mkdir(parents=True)
    sweep = EvalConfig(models=["runs/lr=1e-4/run", str(tmp_path / "lr=1e-4"), "named=runs/lr=1e-4/run"])
    assert sweep.model_paths() == {
        "run": "runs/lr=1e-4/run",
        "lr=1e-4": str(tmp_path / "lr=1e-4"),
        "named": "runs/lr=1e-4/run",
    }
    with pytest.raises(ValueError, match="at least one model"):
        EvalConfig()
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(yaml.safe_dump({"models": ["m"], "block_size": [4]}))
    assert main(["eval", "--config", str(recipe)]) == 2
    assert "block_size" in capsys.readouterr().err


def test_eval_refuses_a_multi_process_launch(tmp_path, capsys, monkeypatch):
    """Under torchrun every process evaluated every row and wrote the same files."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    calls = count_runs(monkeypatch)
    assert main(["eval", "--models", "m=/no/such/model", "--output_dir", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert "t3d-trl eval runs as one process, but was launched as 2" in err and "t3d-trl lm-eval" in err
    assert calls == [] and not (tmp_path / "eval").exists()


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

    with pytest.raises(ValueError, match="dtype must be 'auto' or a floating-point torch dtype.*'float99'"):
        load_model(path, dtype="float99")
    assert main([*argv, "--steps", "4", "--tokens_per_step", "2"]) == 2
    assert capsys.readouterr().err.endswith(
        "t3d-trl generate: give steps (4) or tokens_per_step (2), not both\n"
    )
    # One dialect: snake_case flags, kebab accepted; the chat template switch is eval's and collect's.
    assert main([*argv, "--max-new-tokens", "8", "--tokens-per-step", "2", "--no_use_chat_template"]) == 0
    plain = generate_completions(model, tokenizer, [message], config, use_chat_template=False, progress=False)
    assert capsys.readouterr().out == plain.completions[0] + "\n"


def damaged_copies(model: str, folder: Path) -> None:
    """Copies of ``model`` in ``folder``: ``copy`` whole, ``cut`` with its weights cut short (an interrupted copy or
    download), ``bare`` with its JSON files only."""
    shutil.copytree(model, folder / "copy")
    shutil.copytree(model, folder / "cut")
    shutil.copytree(model, folder / "bare", ignore=shutil.ignore_patterns("*.safetensors"))
    weights = folder / "cut" / "model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size // 2)


def test_generate_names_a_damaged_or_missing_weights_file_in_one_line(saved_models, tmp_path, capsys):
    damaged_copies(saved_models["sdar-like"], tmp_path)
    for name, message in (
        ("cut", "model.safetensors is damaged ("),
        ("bare", "has no weights file (none of"),
    ):
        assert main(["generate", "--model", str(tmp_path / name), "--prompt", "hi"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"t3d-trl generate: {tmp_path / name}") and message in err
        assert "Traceback" not in err and err.count("\n") == 1


def small_grid(models: list[str], benchmark_files, output, *extra: str) -> list[str]:
    return [
        "eval",
        "--models",
        *models,
        "--benchmarks",
        "gsm8k",
        "--data_files",
        f"gsm8k={benchmark_files['gsm8k']}",
        *("--block_lengths", "4", "--tokens_per_step", "4", "--max_new_tokens", "4"),
        *("--output_dir", str(output), *extra),
    ]


def count_runs(monkeypatch) -> list[str]:
    """Record the benchmark of every evaluate_model call of the grid."""
    from t3d_trl.evaluation import runner

    calls: list[str] = []
    real = runner.evaluate_model

    def counting(model, tokenizer, benchmark, *args, **kwargs):
        calls.append(getattr(benchmark, "name", benchmark))
        return real(model, tokenizer, benchmark, *args, **kwargs)

    monkeypatch.setattr(runner, "evaluate_model", counting)
    return calls


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"models": ["./missing-model"]}, "model 'missing-model': model './missing-model': no such folder"),
        ({"models": ["gone=nope-out"]}, "model 'gone': model 'nope-out': no such folder, and offline"),
        (
            {"benchmarks": ["gsm8k", "nope"]},
            "unknown benchmark 'nope'; registered: ['MATH500', 'GSM8K', 'MBPP', 'HumanEval', 'demo-",
        ),
        ({"data_files": ["gsm8k=missing.jsonl"]}, "data file 'missing.jsonl' does not exist"),
        # No local copy, offline: one line (it was a traceback with exit status 1).
        ({"data_files": []}, "could not load benchmark 'GSM8K' from the Hub dataset 'openai/gsm8k'"),
        ({"data_files": ["gsm8k=math.jsonl"]}, "benchmark 'GSM8K' needs column(s) ['question']"),
        ({"thresholds": [1.5]}, "thresholds must be in (0, 1], got 1.5"),
        ({"max_new_tokens": 6}, "decoding setting block4-tokps4"),
        ({"seeds": []}, "seeds must hold at least one seed"),
        # A model folder cut short (see damaged_copies), checked with every other before the first runs.
        (
            {"models": ["cut=cut"]},
            "model 'cut': cut/model.safetensors is damaged (SafetensorError: Error while deserializing",
        ),
        ({"models": ["bare=bare"]}, "model 'bare': bare has no weights file (none of model.safetensors,"),
        # "first!" and "first" share samples/first: the second's samples would overwrite the first's.
        (
            {"models": ["first!=copy"]},
            "models 'first' and 'first!' would write their samples to the same folder",
        ),
        ({"output_dir": "afile"}, "output_dir afile is a file: results.json, table.md and samples/ need a"),
    ],
)
def test_eval_checks_everything_before_the_first_generation(
    saved_models, benchmark_files, tmp_path, capsys, monkeypatch, change, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "math.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n')  # MATH500's schema
    damaged_copies(saved_models["sdar-like"], tmp_path)
    (tmp_path / "afile").write_text("x")
    calls = count_runs(monkeypatch)
    values = {
        "models": [f"first={saved_models['sdar-like']}"],  # a good model first: it must not run either
        "benchmarks": ["gsm8k"],
        "data_files": [f"gsm8k={benchmark_files['gsm8k']}"],
        "block_lengths": [4],
        "tokens_per_step": [4],
        "max_new_tokens": 4,
        "output_dir": str(tmp_path / "eval"),
    }
    values = {**values, **change, "models": values["models"] + change.get("models", [])}
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(yaml.safe_dump(values))
    assert main(["eval", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "t3d-trl eval: " in err and message in err and "Traceback" not in err
    assert calls == [] and not (tmp_path / "eval").exists()


def test_eval_checks_every_model_against_the_decoding_settings_first(
    saved_models, benchmark_files, tmp_path, capsys, monkeypatch
):
    # A block-causal (SDAR-like) model second with cache: dual fails before the first model's runs, naming it.
    calls = count_runs(monkeypatch)
    recipe = tmp_path / "eval.yaml"
    values = {
        "models": [f"first={saved_models['llada-like']}", f"second={saved_models['sdar-like']}"],
        "benchmarks": ["gsm8k"],
        "data_files": [f"gsm8k={benchmark_files['gsm8k']}"],
        "max_new_tokens": 4,
        "cache": "dual",
        "output_dir": str(tmp_path / "eval"),
    }
    recipe.write_text(yaml.safe_dump(values))
    assert main(["eval", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"t3d-trl eval: model 'second' ({saved_models['sdar-like']}): cache_implementation='dual'" in err
    assert "block-causal models decode with their exact block cache" in err
    assert calls == [] and not (tmp_path / "eval").exists()
    values["models"] = values["models"][:1]  # the bidirectional model alone runs with it
    recipe.write_text(yaml.safe_dump(values))
    assert main(["eval", "--config", str(recipe)]) == 0 and calls == ["GSM8K"]


def test_eval_rerun_skips_finished_runs_and_never_shrinks_results(
    saved_models, benchmark_files, tmp_path, capsys, monkeypatch, caplog
):
    output = tmp_path / "eval"
    first, second = f"a={saved_models['sdar-like']}", f"b={saved_models['llada-like']}"
    calls = count_runs(monkeypatch)
    assert main(small_grid([first], benchmark_files, output)) == 0
    assert len(calls) == 1
    with caplog.at_level(logging.INFO, logger="t3d_trl"):
        assert main(small_grid([first, second], benchmark_files, output)) == 0
    assert len(calls) == 2  # only b ran
    assert "skipping 1 run(s) already finished" in caplog.text
    saved = json.loads((output / "results.json").read_text())
    assert [e["model"] for e in saved["results"]] == ["a", "b"]
    assert list(saved["settings"]["models"]) == ["a", "b"]

    # A later, smaller command (or one that crashed) keeps what is there, and the report shows it all.
    assert main(small_grid([second], benchmark_files, output)) == 0
    assert len(calls) == 2
    saved = json.loads((output / "results.json").read_text())
    assert [e["model"] for e in saved["results"]] == ["a", "b"]
    table = (output / "table.md").read_text()
    assert "| a |" in table and "| b |" in table
    # Other run settings make a run stale: it is evaluated again and replaced where it stood.
    assert main(small_grid([first], benchmark_files, output, "--limit", "1")) == 0
    assert len(calls) == 3
    saved = json.loads((output / "results.json").read_text())
    assert [(e["model"], e["metrics"]["num_samples"]) for e in saved["results"]] == [("a", 1), ("b", 2)]


USER_BENCHMARKS = """
from t3d_trl.evaluation.benchmarks import Benchmark, register_benchmark


def checker(completions, examples):
    for example in examples:
        if example["answer"] == "boom":
            raise RuntimeError("cannot judge " + example["id"])
    return [True] * len(completions)


register_benchmark(
    "fragile",
    Benchmark(name="Fragile", path="me/fragile", columns={"answer": "answer"}, checker=checker),
    overwrite=True,
)
"""


def test_user_benchmark_module_and_a_raising_checker(saved_models, tmp_path, capsys):
    from t3d_trl.evaluation.benchmarks import BENCHMARKS

    module = tmp_path / "my_benchmarks.py"
    module.write_text(USER_BENCHMARKS)
    data = tmp_path / "fragile.jsonl"
    data.write_text('{"problem": "a", "answer": "ok"}\n{"problem": "b", "answer": "boom"}\n')
    output = tmp_path / "eval"
    argv = ["eval", "--models", saved_models["sdar-like"], "--benchmarks", "fragile"]
    argv += ["--data_files", f"fragile={data}", "--max_new_tokens", "4", "--output_dir", str(output)]
    try:
        assert main(argv) == 2  # without the module the benchmark is unknown, before anything runs
        assert "unknown benchmark 'fragile'" in capsys.readouterr().err
        assert main([*argv, "--benchmark_modules", str(module)]) == 0
    finally:
        BENCHMARKS.pop("fragile", None)
    saved = json.loads((output / "results.json").read_text())
    (entry,) = saved["results"]
    assert entry["metrics"]["accuracy"] == 0.5  # the run went on: the item that raised is failed
    samples = [json.loads(line) for line in (output / entry["samples_file"]).read_text().splitlines()]
    assert [(s["correct"], s["error"]) for s in samples] == [
        (True, None),
        (False, "RuntimeError: cannot judge 1"),
    ]
    assert main([*argv, "--benchmark_modules", "no_such_module_here"]) == 2
    assert "cannot import 'no_such_module_here'" in capsys.readouterr().err


def test_generate_and_eval_take_an_adapter_folder(saved_models, benchmark_files, tmp_path, capsys):
    from peft import LoraConfig, PeftModel, get_peft_model

    from t3d_trl import AutoModelForDiffusionLM

    base = saved_models["llada-like"]
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapter = tmp_path / "adapter"
    get_peft_model(AutoModelForDiffusionLM.from_pretrained(base), lora).save_pretrained(adapter)
    # No tokenizer in the folder: the base model's is used.
    model, tokenizer = load_model(str(adapter))
    assert isinstance(model, PeftModel)
    argv = ["generate", "--model", str(adapter), "--prompt", "2+2?", "--max_new_tokens", "8"]
    assert main(argv) == 0
    message = format_user_message("plain", {"problem": "2+2?"})
    config = model.diffusion_generation_config.update(max_new_tokens=8)
    expected = generate_completions(model, tokenizer, [message], config, progress=False)
    assert capsys.readouterr().out == expected.completions[0] + "\n"
    base_out = generate_completions(*load_model(base), [message], config, progress=False)
    assert base_out.completions != expected.completions or base_out.nfe != expected.nfe  # the adapter acts

    output = tmp_path / "eval"
    assert main(small_grid([f"lora={adapter}"], benchmark_files, output)) == 0
    saved = json.loads((output / "results.json").read_text())
    assert [e["model"] for e in saved["results"]] == ["lora"]


def test_generate_and_eval_take_the_cache_setting(saved_models, tmp_path, capsys):
    # A trained bidirectional teacher, on a prompt and budget where the dual cache changes the completion (on a
    # default-initialised model the cached and uncached completions are equal, so a dropped --cache would pass).
    path = str(PACKAGED_TEACHERS / "wordsort_bidirectional")
    prompt = "hint note cold jade rust kelp mint lamp"
    argv = ["generate", "--model", path, "--prompt", prompt, "--tokens_per_step", "2"]
    assert main([*argv, "--cache", "dual"]) == 0
    model, tokenizer = load_model(path)
    message = format_user_message("plain", {"problem": prompt})
    expected, uncached = (
        generate_completions(
            model,
            tokenizer,
            [message],
            model.diffusion_generation_config.update(tokens_per_step=2, cache=cache),
            progress=False,
        ).completions[0]
        for cache in ("dual", "none")
    )
    assert expected != uncached  # the setting shows in the output
    assert capsys.readouterr().out == expected + "\n"
    # eval decodes with it too: its sample is the dual-cache completion.
    data = tmp_path / "wordsort.jsonl"
    data.write_text(json.dumps({"id": "w0", "prompt": prompt}) + "\n")
    benchmark = Benchmark(
        name="wordsort-cache",
        path="me/wordsort",
        columns={"problem": "prompt", "id": "id"},
        checker=lambda completions, examples: [True] * len(completions),
    )
    with registered_benchmark("wordsort-cache", benchmark):
        grid = [
            "eval",
            "--models",
            f"teacher={path}",
            "--benchmarks",
            "wordsort-cache",
            "--no_use_chat_template",
        ]
        grid += ["--data_files", f"wordsort-cache={data}", "--block_lengths", "4", "--tokens_per_step", "2"]
        assert main([*grid, "--cache", "dual", "--output_dir", str(tmp_path / "eval")]) == 0
    (entry,) = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    (record,) = [json.loads(line) for line in (tmp_path / "eval" / entry["samples_file"]).open()]
    assert record["completion"] == expected
    assert main([*argv, "--cache", "full"]) == 2
    assert "invalid choice: 'full'" in capsys.readouterr().err
    # The new spelling decodes the same, and use_cache=false turns the approximate cache off.
    assert main([*argv, "--cache_implementation", "dual"]) == 0
    assert capsys.readouterr().out == expected + "\n"
    # A block-causal model has its exact cache: the approximate one is refused with the reason.
    causal = ["generate", "--model", saved_models["sdar-like"], "--prompt", "hi", "--cache", "prefix"]
    assert main([*causal, "--max_new_tokens", "8"]) == 2
    assert "block-causal models decode with their exact block cache" in capsys.readouterr().err
    assert EvalConfig(models=["m"], cache="dual", schedule="dream").generation_kwargs() == {
        "cache": "dual",
        "schedule": "dream",
    }
    assert DiffusionGenerationConfig().update(cache="dual").cache_implementation == "dual"


def test_eval_rerun_evaluates_a_retrained_model_again_and_says_so(
    tokenizer, benchmark_files, tmp_path, monkeypatch, caplog
):
    # Issue 26: the same command after retraining into the model's folder used to print "skipping 1 run(s)" and
    # keep results of weights that no longer exist.
    import torch

    model = build_block_causal_model(tokenizer, max_position_embeddings=1024)
    path = tmp_path / "t3d-out"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    output = tmp_path / "eval"
    calls = count_runs(monkeypatch)
    argv = small_grid([f"t3d={path}"], benchmark_files, output)
    assert main(argv) == 0 and len(calls) == 1
    assert main(argv) == 0 and len(calls) == 1  # unchanged: skipped
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # "retrained": same shapes, other weights
    model.save_pretrained(path)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="t3d_trl"):
        assert main(argv) == 0
    assert len(calls) == 2  # evaluated again
    changed = [r.getMessage() for r in caplog.records if "changed since its results" in r.getMessage()]
    assert changed == [
        f"model 't3d' ({path}) changed since its results in {output / 'results.json'} (weights or saved settings): "
        "evaluating its 1 finished run(s) again"
    ]
    assert "skipping" not in caplog.text


def with_saved_defaults(kind: str, base: str, folder: Path, **saved) -> str:
    """A checkpoint of ``kind`` whose decoding defaults are ``saved``: a model folder (config.json), a LoRA adapter
    of ``base`` (diffusion_config.json), or a published Dream checkpoint (its family's: remasking='entropy')."""
    if kind == "published":
        from published_checkpoints import build_published

        return str(build_published(folder, "dream")[0])
    generation = {**DiffusionGenerationConfig().to_dict(), **saved}
    if kind == "saved":
        shutil.copytree(base, folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "diffusion_generation": generation}))
        return str(folder)
    from peft import LoraConfig, get_peft_model

    from t3d_trl import AutoModelForDiffusionLM

    lora = LoraConfig(r=2, target_modules=["q_proj"])
    get_peft_model(AutoModelForDiffusionLM.from_pretrained(base), lora).save_pretrained(folder)
    (folder / "diffusion_config.json").write_text(json.dumps({"diffusion_generation": generation}))
    return str(folder)


@pytest.mark.parametrize(
    ("kind", "saved", "grid", "message"),
    [
        (
            "saved",
            {"remasking": "entropy"},
            {"thresholds": [0.9], "max_new_tokens": 4},
            "decoding setting block4-threshold0.9 over its saved decoding defaults with {'max_new_tokens': 4}: "
            "dynamic decoding compares a probability with the threshold; remasking='entropy' has no probability",
        ),
        (
            "saved",
            {"max_new_tokens": 8},  # no --max_new_tokens: the saved length, which block 16 does not divide
            {"block_lengths": [16], "tokens_per_step": [4]},
            "decoding setting block16-tokps4 over its saved decoding defaults: max_new_tokens=8 is not a multiple "
            "of block_length=16",
        ),
        (
            "adapter",
            {"remasking": "entropy"},
            {"thresholds": [0.9], "max_new_tokens": 4},
            "decoding setting block4-threshold0.9 over its saved decoding defaults with {'max_new_tokens': 4}: "
            "dynamic decoding",
        ),
        (
            "published",
            {},
            {"thresholds": [0.9], "max_new_tokens": 4},
            "remasking='entropy' has no probability",
        ),
    ],
)
def test_eval_checks_every_models_saved_defaults_before_the_first_run(
    saved_models, benchmark_files, tmp_path, capsys, monkeypatch, kind, saved, grid, message
):
    """The settings were checked over the class defaults: the first model ran, then the second one's saved
    defaults (Dream's remasking, a saved length) stopped the grid, without naming it."""
    second = with_saved_defaults(kind, saved_models["llada-like"], tmp_path / "second", **saved)
    capsys.readouterr()  # building an adapter prints a progress bar
    calls = count_runs(monkeypatch)
    recipe = tmp_path / "eval.yaml"
    values = {
        "models": [f"first={saved_models['llada-like']}", f"second={second}"],
        "benchmarks": ["gsm8k"],
        "data_files": [f"gsm8k={benchmark_files['gsm8k']}"],
        "block_lengths": [4],
        "tokens_per_step": [],
        "output_dir": str(tmp_path / "eval"),
        **grid,
    }
    recipe.write_text(yaml.safe_dump(values))
    assert main(["eval", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("t3d-trl eval: model 'second': ") and message in err, err
    assert calls == [] and not (tmp_path / "eval").exists()


@pytest.mark.parametrize("kind", ["sdar-like", "llada-like", "published", "adapter", "adapter-bare"])
def test_saved_decoding_defaults_are_the_ones_a_model_loads_with(saved_models, tmp_path, kind):
    """What the checks before the first run read from the config files alone is what loading gives (but the stop
    ids a published checkpoint's tokenizer adds)."""
    if kind in saved_models:
        path = saved_models[kind]
    elif kind == "adapter-bare":  # no diffusion_config.json: its base model's
        path = with_saved_defaults("adapter", saved_models["sdar-like"], tmp_path / kind)
        (tmp_path / kind / "diffusion_config.json").unlink()
    else:
        path = with_saved_defaults(
            kind, saved_models["llada-like"], tmp_path / kind, max_new_tokens=8, steps=4
        )
    defaults, block_size = saved_decoding_defaults(path)
    model, _ = load_model(path, device="cpu")
    loaded = model.diffusion_generation_config
    assert defaults == (loaded if kind != "published" else loaded.update(eos_token_id=defaults.eos_token_id))
    assert block_size == (
        model.diffusion_config.block_size if model.diffusion_config.is_block_causal else None
    )
    assert block_size == (4 if kind in ("sdar-like", "adapter-bare") else None)
