"""The demo tasks as ``t3d-trl eval`` benchmarks: ``demo-<task>`` reads the task's held-out ``test`` split.

    t3d-trl eval --models t3d_trl/demo/teachers/wordsort --benchmarks demo-wordsort --no_use_chat_template

A completion is correct when it is one of the prompt's valid answers (:meth:`DemoTask.is_valid`). Nothing is
downloaded: the rows are generated (:meth:`DemoTask.split`).
"""

from __future__ import annotations

from typing import Any

from ..evaluation.benchmarks import Benchmark, register_benchmark
from .tasks import DEMO_TASKS, DemoTask

PREFIX = "demo-"


def demo_benchmark(task: DemoTask) -> Benchmark:
    """The benchmark ``demo-<task>``: the task's ``test`` split, judged by the task's validity check."""

    def checker(completions: list[str], examples: list[dict[str, Any]]) -> list[bool]:
        return [task.is_valid(example["problem"], c) for c, example in zip(completions, examples)]

    return Benchmark(
        name=f"{PREFIX}{task.name}",
        path=f"demo:{task.name}",
        checker=checker,
        columns={"id": "id", "problem": "prompt", "answer": "answer"},
        rows=lambda: task.split("test"),
    )


def register_demo_benchmarks() -> list[str]:
    """Register ``demo-<task>`` for every demo task (replacing an earlier registration); returns their names."""
    return [
        register_benchmark(b.name, b, overwrite=True).name for b in map(demo_benchmark, DEMO_TASKS.values())
    ]
