"""The benchmark metrics as Hugging Face ``evaluate`` modules, shipped inside the package.

Each metric lives in ``<name>/<name>.py`` next to this file, so it loads offline, by path::

    import evaluate
    from t3d_trl.evaluation.metric_modules import load_metric, metric_path

    math_acc = load_metric("math_accuracy")          # or evaluate.load(metric_path("math_accuracy"))
    math_acc.compute(predictions=["... \\boxed{12}"], references=["... #### 12"])
    code = load_metric("code_pass_at_k")
    code.compute(predictions=[[completion_1, completion_2]], references=[tests], k=[1, 2])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["METRIC_NAMES", "load_metric", "metric_path"]

#: Names of the metric modules shipped with t3d-trl.
METRIC_NAMES = ("math_accuracy", "code_pass_at_k")

_ROOT = Path(__file__).resolve().parent


def metric_path(name: str) -> str:
    """Directory of the shipped metric module ``name`` (what ``evaluate.load`` takes)."""
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown metric {name!r}; available: {', '.join(METRIC_NAMES)}")
    return str(_ROOT / name)


def load_metric(name: str, **kwargs: Any):
    """``evaluate.load`` the shipped metric module ``name`` from its path (works with ``HF_HUB_OFFLINE=1``).

    ``kwargs`` are passed to ``evaluate.load`` (e.g. ``experiment_id``, ``keep_in_memory``).
    """
    import evaluate

    return evaluate.load(metric_path(name), **kwargs)
