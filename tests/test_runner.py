"""The evaluation runner: metrics on scripted completions, batching, seeds and pass@k, the grid."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import statistics

import pytest
import torch
from testing_utils import (
    BENCHMARK_ROWS,
    build_bidirectional_model,
    build_block_causal_model,
    registered_benchmark,
)

from t3d_trl import DiffusionGenerationConfig, DiffusionGenerationOutput
from t3d_trl.data.prompts import render_prompt
from t3d_trl.evaluation import runner
from t3d_trl.evaluation.benchmarks import BENCHMARKS, Benchmark, get_benchmark, register_benchmark
from t3d_trl.evaluation.completions import Generations, generate_completions
from t3d_trl.evaluation.grid import DecodingSetting, grid_settings
from t3d_trl.evaluation.runner import evaluate_model, run_grid

pytestmark = pytest.mark.usefixtures("single_thread")


class ScriptedModel(torch.nn.Module):
    """A stand-in for a diffusion LM: answers each prompt with the script whose key occurs in it.

    A script is a string or ``generator -> string`` (for sampling runs). Every completion ends with EOS and
    costs ``2 * tokens`` forward passes, so every metric of a run is known in advance.
    """

    def __init__(self, tokenizer, scripts, **defaults):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.defaults = defaults  # saved decoding defaults other than the ones below
        self.batches: list[list[int]] = []  # prompt lengths of every call
        self.configs: list[DiffusionGenerationConfig] = []

    @property
    def diffusion_generation_config(self):
        return DiffusionGenerationConfig(
            **{"max_new_tokens": 32, "eos_token_id": self.tokenizer.eos_token_id, **self.defaults}
        )

    def completion(self, prompt, generator=None):
        script = next(value for key, value in self.scripts.items() if key in prompt)
        return script(generator) if callable(script) else script

    def diffusion_generate(
        self, input_ids, attention_mask=None, generation_config=None, generator=None, streamer=None
    ):
        eos = self.tokenizer.eos_token_id
        rows, nfe = [], []
        for ids, mask in zip(input_ids, attention_mask):
            text = self.completion(self.tokenizer.decode(ids[mask.bool()]), generator)
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
            rows.append(tokens + [eos] * (generation_config.max_new_tokens - len(tokens)))
            nfe.append(2 * len(tokens))
        self.batches.append(attention_mask.sum(-1).tolist())
        self.configs.append(generation_config)
        generated = torch.tensor(rows)
        return DiffusionGenerationOutput(
            sequences=torch.cat([input_ids, generated], dim=1),
            decode_steps=torch.ones_like(generated),
            nfe=torch.tensor(nfe),
        )


GSM8K_SCRIPTS = {"Tom has": "1 + 3 = 4, so \\boxed{4}", "A box holds": "2 boxes: \\boxed{13}"}


def coin(answer):
    """A sampled completion: ``answer`` or a wrong one, with probability 1/2 each."""
    return lambda generator: (
        f"\\boxed{{{answer}}}" if torch.rand((), generator=generator) < 0.5 else "\\boxed{7}"
    )


def test_metrics_of_scripted_completions(tokenizer, benchmark_files):
    model = ScriptedModel(tokenizer, GSM8K_SCRIPTS)
    result = evaluate_model(model, tokenizer, "gsm8k", data_files=benchmark_files["gsm8k"], progress=False)
    texts = list(GSM8K_SCRIPTS.values())
    assert [r.completion for r in result.records] == texts
    assert [r.correct for r in result.records] == [True, False]
    assert [r.num_tokens for r in result.records] == [len(t) + 1 for t in texts]  # characters + EOS
    assert [r.id for r in result.records] == ["0", "1"]
    assert all(r.finished for r in result.records)
    assert result.records[0].prompt == render_prompt(
        tokenizer, get_benchmark("gsm8k").user_message({"problem": BENCHMARK_ROWS["gsm8k"][0]["question"]})
    )
    m = result.metrics
    tokens = sum(len(t) + 1 for t in texts)
    seconds = sum(r.latency for r in result.records)
    assert m["accuracy"] == 0.5 and m["accuracy_std"] == 0.0
    assert m["mean_output_length"] == tokens / 2
    assert m["mean_nfe"] == tokens  # two forward passes per token
    assert m["tokens_per_step"] == 0.5
    assert m["tokens_per_second"] == pytest.approx(tokens / seconds)
    assert m["latency_per_sample"] == pytest.approx(seconds / 2)
    assert result.per_seed == [{k: v for k, v in m.items() if not k.endswith("_std")}]
    assert result.generation_config["max_new_tokens"] == 32
    assert len(model.batches) == 2  # an untimed warm-up call, then one batch of both prompts
    evaluate_model(
        model, tokenizer, "gsm8k", data_files=benchmark_files["gsm8k"], warmup=False, progress=False
    )
    assert len(model.batches) == 3


def test_code_samples_keep_their_sandbox_status(tokenizer, benchmark_files):
    # Why a code sample failed is in its record (the checker's own ``error`` stays None: it did not raise).
    scripts = {
        "add two numbers": "```python\nimport sys\ndef add(a, b):\n    return a + b\nsys.exit(0)\n```",
        "square root": "```python\nimport math\ndef isqrt(n):\n    return math.isqrt(n)\n```",
    }
    model = ScriptedModel(tokenizer, scripts)
    config = model.diffusion_generation_config.update(max_new_tokens=80)
    result = evaluate_model(
        model, tokenizer, "mbpp", config, data_files=benchmark_files["mbpp"], progress=False
    )
    records = [dataclasses.asdict(r) for r in result.records]
    assert [(r["correct"], r["error"], r["sandbox_status"]) for r in records] == [
        (False, None, "exited"),
        (True, None, "passed"),
    ]
    assert records[0]["sandbox_error"] == "SystemExit(0)" and records[1]["sandbox_error"] is None
    gsm8k = evaluate_model(
        ScriptedModel(tokenizer, GSM8K_SCRIPTS),
        tokenizer,
        "gsm8k",
        data_files=benchmark_files["gsm8k"],
        progress=False,
    )
    assert [(r.sandbox_status, r.sandbox_error) for r in gsm8k.records] == [(None, None)] * 2


def test_throughput_without_measured_time_is_nan():
    out = Generations(["p"], ["c"], num_tokens=[3], nfe=[1], finished=[True], latency=[0.0])
    assert math.isnan(out.tokens_per_second)
    assert Generations(["p"], ["c"], [3], [1], [True], [1.5]).tokens_per_second == 2.0


def test_batching_sorts_by_length_and_keeps_the_order(tokenizer):
    scripts = {f"q{i}": f"answer {i}" for i in range(5)}
    messages = ["q0", "q1 a longer prompt", "q2 mid", "q3 the longest prompt of all", "q4"]
    outputs = {}
    for batch_size in (1, 2, 8):
        model = ScriptedModel(tokenizer, scripts)
        out = generate_completions(model, tokenizer, messages, batch_size=batch_size, progress=False)
        outputs[batch_size] = out.completions
        lengths = [n for batch in model.batches for n in batch]
        assert lengths == sorted(lengths, reverse=True)
        assert [len(b) for b in model.batches] == [min(batch_size, 5 - i) for i in range(0, 5, batch_size)]
    assert outputs[1] == outputs[2] == outputs[8] == [f"answer {i}" for i in range(5)]


def test_seeds_samples_and_pass_at_k(tokenizer, benchmark_files):
    model = ScriptedModel(tokenizer, {"2+2": coin("4"), "frac": coin("0.5")})
    kwargs = dict(data_files=benchmark_files["math500"], num_samples=4, pass_k=(1, 2, 4), progress=False)
    result = evaluate_model(model, tokenizer, "math500", seeds=[0, 1, 2], **kwargs)
    assert len(result.records) == 2 * 4 * 3
    accuracies = []
    for seed, metrics in zip([0, 1, 2], result.per_seed):
        records = [r for r in result.records if r.seed == seed]
        assert sorted((r.id, r.sample) for r in records) == sorted(
            (i, s) for i in ("test/algebra/1.json", "test/algebra/2.json") for s in range(4)
        )
        accuracies.append(sum(r.correct for r in records) / len(records))
        assert metrics["accuracy"] == accuracies[-1]
        for k in (1, 2, 4):
            per_problem = []
            for problem in ("test/algebra/1.json", "test/algebra/2.json"):
                c = sum(r.correct for r in records if r.id == problem)
                per_problem.append(1 - math.comb(4 - c, k) / math.comb(4, k))
            assert metrics[f"pass@{k}"] == pytest.approx(sum(per_problem) / 2)
        assert metrics["pass@1"] == pytest.approx(metrics["accuracy"])
    assert (
        len({tuple(r.correct for r in result.records if r.seed == s) for s in (0, 1, 2)}) > 1
    )  # seeds matter
    assert result.metrics["accuracy"] == pytest.approx(statistics.mean(accuracies))
    assert result.metrics["accuracy_std"] == pytest.approx(statistics.stdev(accuracies))
    again = evaluate_model(model, tokenizer, "math500", seeds=[1], **kwargs)
    assert [r.completion for r in again.records] == [r.completion for r in result.records if r.seed == 1]


def test_custom_benchmark_by_name(tokenizer, tmp_path):
    path = tmp_path / "capitals.jsonl"
    path.write_text('{"country": "France", "city": "Paris"}\n{"country": "Italy", "city": "Rome"}\n')
    benchmark = Benchmark(
        name="Capitals",
        path="me/capitals",
        columns={"answer": "city"},
        prompt_template="Capital of {country}?",
        checker=lambda completions, examples: [c == e["answer"] for c, e in zip(completions, examples)],
    )
    register_benchmark("capitals-test", benchmark)
    try:
        model = ScriptedModel(tokenizer, {"France": "Paris", "Italy": "Milan"})
        result = evaluate_model(model, tokenizer, "capitals-test", data_files=path, progress=False)
    finally:
        BENCHMARKS.pop("capitalstest")
    assert result.benchmark == "Capitals"
    assert [r.correct for r in result.records] == [True, False] and result.metrics["accuracy"] == 0.5
    assert "Capital of France?" in result.records[0].prompt


def test_a_benchmark_without_examples_is_refused_before_any_generation(tokenizer, benchmark_files, tmp_path):
    empty = Benchmark(
        name="Empty", path="me/empty", checker=lambda completions, examples: [], rows=lambda: []
    )
    model = ScriptedModel(tokenizer, GSM8K_SCRIPTS)
    with (
        registered_benchmark("empty-test", empty),
        pytest.raises(ValueError, match="'Empty' has no examples"),
    ):
        run_grid(
            {"m": model},
            ["gsm8k", "empty-test"],  # the good benchmark first: it must not run either
            tokenizer=tokenizer,
            data_files={"gsm8k": benchmark_files["gsm8k"]},
            output_dir=tmp_path / "eval",
            progress=False,
        )
    assert model.batches == [] and not (tmp_path / "eval").exists()


def test_argument_errors_and_greedy_sampling_warning(tokenizer, benchmark_files, caplog):
    model = ScriptedModel(tokenizer, GSM8K_SCRIPTS)
    files = benchmark_files["gsm8k"]
    with pytest.raises(ValueError, match=r"1 <= k <= num_samples=2, got k=\[3\]"):
        evaluate_model(model, tokenizer, "gsm8k", data_files=files, num_samples=2, pass_k=(3,))
    with pytest.raises(ValueError, match="seeds must hold"):
        evaluate_model(model, tokenizer, "gsm8k", data_files=files, seeds=[])
    with caplog.at_level(logging.WARNING, logger="t3d_trl.evaluation.runner"):
        result = evaluate_model(model, tokenizer, "gsm8k", data_files=files, num_samples=2, progress=False)
    assert "all samples are identical" in caplog.text
    assert result.metrics["pass@2"] == 0.5


def test_prompts_the_tokenizer_cannot_read_are_refused_before_decoding(tokenizer):
    """A model of another task (its tokenizer reads the benchmark as unknown tokens) would be scored on
    nothing: refused in one line, as collection refuses it."""
    model = build_block_causal_model(tokenizer)
    config = DiffusionGenerationConfig(max_new_tokens=8, block_length=4)
    with pytest.raises(ValueError, match=r"16 of the prompts' 16 tokens are the unknown token '\[UNK\]'"):
        generate_completions(model, tokenizer, ["ßøñé" * 2] * 2, config, use_chat_template=False)
    out = generate_completions(
        model, tokenizer, ["café au lait"], config, use_chat_template=False, progress=False
    )
    assert len(out.completions) == 1  # one unknown character among known ones decodes


def test_real_tiny_model_matches_direct_generation(tokenizer, benchmark_files):
    model = build_block_causal_model(tokenizer, max_position_embeddings=1024)
    config = DiffusionGenerationConfig(max_new_tokens=8, block_length=4, tokens_per_step=2)
    result = evaluate_model(
        model, tokenizer, "gsm8k", config, data_files=benchmark_files["gsm8k"], batch_size=1, progress=False
    )
    eos = tokenizer.eos_token_id
    for record in result.records:
        ids = tokenizer(record.prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        out = model.diffusion_generate(ids, generation_config=config, return_dict_in_generate=True)
        generated = out.sequences[0, ids.shape[1] :].tolist()
        cut = generated.index(eos) if eos in generated else len(generated)
        assert record.completion == tokenizer.decode(generated[:cut], skip_special_tokens=True)
        assert record.num_tokens == min(cut + 1, 8) and record.finished == (eos in generated)
        # Block-causal blocks are aligned to position 0: the prompt tail shares the first one.
        blocks = -(-(ids.shape[1] % 4 + 8) // 4)
        assert record.nfe == int(out.nfe[0]) <= 2 * blocks


def test_grid_settings():
    # The runner keeps re-exporting them (their old import path).
    assert runner.DecodingSetting is DecodingSetting and runner.grid_settings is grid_settings
    settings = grid_settings([4, 8], [2, 8], [0.9])
    assert [s.label for s in settings] == [
        "block4-tokps2",
        "block4-threshold0.9",
        "block8-tokps2",
        "block8-tokps8",
        "block8-threshold0.9",
    ]
    # A dynamic setting leaves the static budget to the model (threshold_topup tops up to it).
    assert settings[1].overrides() == {"block_length": 4, "threshold": 0.9}
    # steps is a static budget of its own: the setting's overrides leave tokens_per_step to clear.
    (by_steps,) = grid_settings([4], steps=[8])
    assert by_steps.label == "block4-steps8"
    config = DiffusionGenerationConfig(tokens_per_step=2).update(**by_steps.overrides())
    assert (config.steps, config.tokens_per_step) == (8, None)
    assert DecodingSetting(4, 2).overrides()["threshold"] is None
    with pytest.raises(ValueError, match="grid is empty"):
        grid_settings([4], [8])
    with pytest.raises(ValueError, match=r"thresholds must be in \(0, 1\], got 1.5"):
        grid_settings([4], [], [1.5])


def test_run_grid_with_scripted_models(tokenizer, benchmark_files, tmp_path):
    math_right = {"2+2": "\\boxed{4}", "frac": "\\boxed{0.5}"}
    models = {
        "original": (
            ScriptedModel(tokenizer, {**GSM8K_SCRIPTS, "2+2": "\\boxed{4}", "frac": "\\boxed{1}"}),
            tokenizer,
        ),
        "distilled": ScriptedModel(
            tokenizer, {"Tom has": "\\boxed{4}", "A box holds": "\\boxed{12}", **math_right}
        ),
    }
    grid = run_grid(
        models,
        ["gsm8k", "MATH-500"],
        block_lengths=[4, 8],
        tokens_per_step=[2, 4],
        thresholds=[0.9],
        tokenizer=tokenizer,
        data_files=benchmark_files_by_name(benchmark_files),
        output_dir=tmp_path,
        generation_kwargs={"max_new_tokens": 40},
        progress=False,
    )
    labels = [
        "block4-tokps2",
        "block4-tokps4",
        "block4-threshold0.9",
        "block8-tokps2",
        "block8-tokps4",
        "block8-threshold0.9",
    ]
    assert len(grid.results) == 2 * 2 * len(labels)
    for name, model in (("original", models["original"][0]), ("distilled", models["distilled"])):
        seen = {(c.block_length, c.tokens_per_step, c.threshold, c.max_new_tokens) for c in model.configs}
        assert {
            (b, t, th, 40)
            for b, t, th in [(4, 2, None), (4, 4, None), (4, 1, 0.9), (8, 2, None), (8, 4, None), (8, 1, 0.9)]
        } <= seen
        for label in labels:
            assert grid.metric(name, "GSM8K", label) == (0.5 if name == "original" else 1.0)
            assert grid.metric(name, "MATH500", label) == (0.5 if name == "original" else 1.0)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(grid.to_dict()))
    assert saved["settings"]["benchmarks"] == ["GSM8K", "MATH500"]
    entry = saved["results"][0]
    assert entry["generation_config"]["block_length"] == entry["setting"]["block_length"]
    samples = [json.loads(line) for line in (tmp_path / entry["samples_file"]).read_text().splitlines()]
    assert [s["completion"] for s in samples] == list(GSM8K_SCRIPTS.values())
    assert (tmp_path / "table.md").is_file() and (tmp_path / "accuracy_vs_throughput.png").is_file()
    with pytest.raises(KeyError, match="no result for model='nope'"):
        grid.metric("nope", "GSM8K", "block4-tokps2")


def benchmark_files_by_name(files):
    return {"gsm8k": files["gsm8k"], "math500": files["math500"]}


def test_batch_size_none_is_chosen_from_memory(tokenizer):
    # On the CPU there is no free-memory reading: the default batch size, the order kept.
    scripts = {f"q{i}": f"answer {i}" for i in range(10)}
    messages = [f"q{i}" + " x" * (i % 4) for i in range(10)]
    model = ScriptedModel(tokenizer, scripts)
    model.diffusion_config = type("Diffusion", (), {"block_size": None})()
    out = generate_completions(model, tokenizer, messages, batch_size=None, progress=False)
    assert [len(b) for b in model.batches] == [8, 2]
    assert out.completions == [f"answer {i}" for i in range(10)]
    assert out.peak_memory_gb is None


def test_run_grid_refuses_an_output_folder_it_cannot_fill_before_any_generation(
    tokenizer, benchmark_files, tmp_path
):
    """Two model names that share a samples/ folder (``t/3d`` and ``t_3d``), or an output_dir that is a file, are
    refused before the first generation: otherwise the second model's samples overwrote the first's, or the grid
    failed after its first run."""
    first, second = ScriptedModel(tokenizer, GSM8K_SCRIPTS), ScriptedModel(tokenizer, GSM8K_SCRIPTS)

    def grid(models, output):
        return run_grid(
            models,
            ["gsm8k"],
            tokenizer=tokenizer,
            data_files={"gsm8k": benchmark_files["gsm8k"]},
            generation_kwargs={"max_new_tokens": 40},
            output_dir=output,
            progress=False,
        )

    output = tmp_path / "eval"
    with pytest.raises(
        ValueError, match=r"models 't/3d' and 't_3d' would write their samples to the same folder"
    ):
        grid({"t/3d": first, "t_3d": second}, output)
    assert first.batches == second.batches == [] and not output.exists()
    grid({"t_3d": second}, output)
    # A rerun into the folder: a new name that shares a folder with an earlier result's is refused too.
    with pytest.raises(ValueError, match=r"models 'T/3d' and 't_3d' \(its results are in .*results.json\)"):
        grid({"T/3d": first}, output)
    (tmp_path / "afile").write_text("x")
    for path, message in (
        (tmp_path / "afile", "is a file"),
        (tmp_path / "afile" / "sub", "is under .*afile"),
    ):
        with pytest.raises(NotADirectoryError, match=rf"output_dir .* {message}"):
            grid({"m": first}, path)
    assert first.batches == []
    assert len(grid({"t/3d": first, "t_3d": second}, None).results) == 2  # no samples written: no clash


def test_a_dict_generation_config_is_a_whole_config_and_stays_the_callers(tokenizer, benchmark_files):
    """A dict failed in generate_completions (AttributeError) and, in evaluate_model, only after decoding the
    whole benchmark with the saved defaults (TypeError); both wrote into the caller's dict."""
    model = ScriptedModel(tokenizer, GSM8K_SCRIPTS)
    given = {"max_new_tokens": 40, "tokens_per_step": 2, "eos_token_id": tokenizer.eos_token_id}
    out = generate_completions(model, tokenizer, ["Tom has"], given, progress=False)
    assert out.completions == [GSM8K_SCRIPTS["Tom has"]]
    result = evaluate_model(
        model, tokenizer, "gsm8k", given, data_files=benchmark_files["gsm8k"], progress=False
    )
    assert [(c.max_new_tokens, c.tokens_per_step) for c in model.configs] == [
        (40, 2)
    ] * 3  # one, warm-up, run
    assert result.generation_config["tokens_per_step"] == 2
    assert given == {"max_new_tokens": 40, "tokens_per_step": 2, "eos_token_id": tokenizer.eos_token_id}


@pytest.mark.parametrize(
    ("key", "value", "argument"),
    [
        ("block_length", 4, "block_lengths"),
        ("tokens_per_step", 2, "tokens_per_step"),
        ("threshold", 0.9, "thresholds"),
        ("steps", 4, "steps"),
    ],
)
def test_run_grid_refuses_the_grid_fields_in_generation_kwargs(
    tokenizer, benchmark_files, key, value, argument
):
    """The grid set them on every run: a threshold or block length given there was dropped, the run labelled by
    the grid (steps clashed with the grid's tokens_per_step)."""
    model = ScriptedModel(tokenizer, GSM8K_SCRIPTS)
    with pytest.raises(
        ValueError, match=rf"generation_kwargs sets {key}={value}, .*run_grid's {argument}=\["
    ):
        run_grid(
            {"m": model},
            ["gsm8k"],
            tokenizer=tokenizer,
            data_files={"gsm8k": benchmark_files["gsm8k"]},
            generation_kwargs={key: value},
            progress=False,
        )
    assert model.batches == []


@pytest.mark.parametrize(
    ("defaults", "grid", "message"),
    [
        (
            {"remasking": "entropy"},  # Dream's: no probability to compare with a threshold
            {"tokens_per_step": [], "thresholds": [0.9]},
            r"model 'second': decoding setting block4-threshold0.9 over its saved decoding defaults: dynamic "
            r"decoding .* remasking='entropy'",
        ),
        (
            {"max_new_tokens": 8},  # no --max_new_tokens: each model's saved length
            {"block_lengths": [16]},
            r"model 'second': decoding setting block16-tokps1 over .*: max_new_tokens=8 is not a multiple of "
            r"block_length=16",
        ),
        (
            {
                "dynamic_rule": "threshold_topup",
                "tokens_per_step": 4,
            },  # its top-up quota does not fit block 2
            {"block_lengths": [2], "tokens_per_step": [], "thresholds": [0.9]},
            r"model 'second': decoding setting block2-threshold0.9 .*: tokens_per_step=4 is larger than block_length=2",
        ),
    ],
)
def test_run_grid_checks_every_models_own_defaults_before_the_first_run(
    tokenizer, benchmark_files, defaults, grid, message
):
    """Settings were checked over the class defaults: a later model's saved ones stopped the grid midway."""
    first, second = (
        ScriptedModel(tokenizer, GSM8K_SCRIPTS),
        ScriptedModel(tokenizer, GSM8K_SCRIPTS, **defaults),
    )
    with pytest.raises(ValueError, match=message):
        run_grid(
            {"first": first, "second": second},
            ["gsm8k"],
            tokenizer=tokenizer,
            data_files={"gsm8k": benchmark_files["gsm8k"]},
            progress=False,
            **grid,
        )
    assert first.batches == second.batches == []


@pytest.mark.parametrize("rule", ["threshold_topup", "threshold"])
def test_dynamic_settings_decode_as_the_model_would(tokenizer, benchmark_files, tmp_path, rule):
    """A dynamic setting forced tokens_per_step=1, so a threshold_topup model topped up to 1 token a step where
    diffusion_generate (and generate, lm-eval) topped up to its saved 4. The plain rule reads no quota: it decodes
    as before (one token per step), at a block smaller than the saved quota too."""
    model = build_bidirectional_model(tokenizer, max_position_embeddings=1024)
    saved = model.diffusion_generation_config.update(
        max_new_tokens=16, block_length=8, tokens_per_step=4, dynamic_rule=rule
    )
    saved.save_to_model_config(model.config)
    blocks = [8] if rule == "threshold_topup" else [2, 8]
    grid = run_grid(
        {"m": (model, tokenizer)},
        ["gsm8k"],
        block_lengths=blocks,
        tokens_per_step=[],
        thresholds=[0.9],
        data_files={"gsm8k": benchmark_files["gsm8k"]},
        limit=1,
        output_dir=tmp_path,
        progress=False,
    )
    message = get_benchmark("gsm8k").user_message({"problem": BENCHMARK_ROWS["gsm8k"][0]["question"]})
    for entry, block in zip(grid.results, blocks):
        (sample,) = [json.loads(line) for line in (tmp_path / entry["samples_file"]).read_text().splitlines()]
        direct = saved.update(block_length=block, threshold=0.9)  # what diffusion_generate decodes
        if rule == "threshold":
            direct = direct.update(tokens_per_step=1)  # the grid's former setting: the same tokens
        expected = generate_completions(model, tokenizer, [message], direct, progress=False)
        assert (sample["completion"], sample["nfe"]) == (expected.completions[0], expected.nfe[0])
        assert entry["generation_config"]["tokens_per_step"] == direct.tokens_per_step
    if rule == "threshold_topup":  # the quota matters: one token a step decodes otherwise
        ones = generate_completions(
            model, tokenizer, [message], direct.update(tokens_per_step=1), progress=False
        )
        assert ones.nfe[0] > expected.nfe[0]


def test_an_unused_data_file_is_named_and_not_recorded(caplog):
    from t3d_trl.evaluation.grid import grid_benchmarks

    benchmarks, data_files = grid_benchmarks(["gsm8k"], {"gsm8k": "g.jsonl", "math500": "m.jsonl"}, None)
    assert [b.name for b in benchmarks] == ["GSM8K"] and data_files == {"GSM8K": "g.jsonl"}
    assert "data_files of benchmark(s) ['MATH500'] are not used" in caplog.text
