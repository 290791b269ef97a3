"""Figures of :class:`TotalCorrelationResult` s, one panel or line per model (matplotlib, no display needed).

Figures are drawn on ``matplotlib.figure.Figure`` objects directly (the Agg canvas), so nothing here touches
pyplot's global state or needs a display.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from .total_correlation import TotalCorrelationResult


def _check(results: Mapping[str, TotalCorrelationResult]) -> None:
    if not results:
        raise ValueError("no results to plot: pass {model name: TotalCorrelationResult}")


def plot_tc_heatmap(results: Mapping[str, TotalCorrelationResult], path: str | os.PathLike) -> Path:
    """TC over decoding intervals, one panel per model on a shared colour scale (like the paper's Figure 2).

    x = ``t``, the block's masked tokens before the jump; y = ``s``, after it (``s = 0``: the block is finished).
    Cells below the diagonal are jumps; the further from the diagonal, the larger the jump. Values are in nats.
    """
    _check(results)
    matrices = {name: result.matrix() for name, result in results.items()}
    values = np.concatenate([m[~np.isnan(m)] for m in matrices.values()])
    vmax = max(float(values.max()) if values.size else 0.0, 1e-6)
    vmin = min(float(values.min()) if values.size else 0.0, 0.0)
    size = max(r.block_length for r in results.values())
    fig = Figure(figsize=(4.0 * len(results) + 1.5, 4.0), layout="constrained")
    axes = fig.subplots(1, len(results), squeeze=False)[0]
    image = None
    for ax, (name, matrix) in zip(axes, matrices.items()):
        image = ax.imshow(matrix, origin="lower", cmap="magma", vmin=vmin, vmax=vmax)
        n = matrix.shape[0] - 1
        for s in range(n + 1):
            for t in range(n + 1):
                if not math.isnan(matrix[s, t]) and size <= 8:
                    light = matrix[s, t] < vmin + 0.6 * (vmax - vmin)
                    ax.text(
                        t,
                        s,
                        f"{matrix[s, t]:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="w" if light else "k",
                    )
        ax.set_title(name)
        ax.set_xlabel("t: masked tokens before the jump")
        ax.set_xticks(range(n + 1))
        ax.set_yticks(range(n + 1))
        ax.set_xlim(0.5, n + 0.5)
        ax.set_ylim(-0.5, n - 0.5)
    axes[0].set_ylabel("s: masked tokens after the jump")
    fig.colorbar(image, ax=list(axes), label="conditional total correlation (nats)")
    fig.suptitle("Factorization error TC(x_s | x_t)")
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path


def _line_plot(
    results: Mapping[str, TotalCorrelationResult],
    path: str | os.PathLike,
    key: str,
    x: str,
    y: str,
    labels: tuple[str, str, str],
) -> Path:
    _check(results)
    fig = Figure(figsize=(5.0, 3.6), layout="constrained")
    ax = fig.subplots()
    for name, result in results.items():
        points = getattr(result, key)
        xs = [p[x] for p in points]
        ys = [p[y] for p in points]
        errors = [0.0 if p["stderr"] is None or math.isnan(p["stderr"]) else p["stderr"] for p in points]
        ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=name)
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(labels[2])
    ax.grid(alpha=0.3)
    ax.legend()
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path


def plot_tc_by_jump(results: Mapping[str, TotalCorrelationResult], path: str | os.PathLike) -> Path:
    """TC against jump size (tokens unmasked in one step), averaged over states, one line per model."""
    labels = ("jump size (tokens committed in one step)", "TC (nats)", "Factorization error by jump size")
    return _line_plot(results, path, "by_jump", "jump", "tc", labels)


def plot_entropy(results: Mapping[str, TotalCorrelationResult], path: str | os.PathLike) -> Path:
    """Mean predictive entropy of the masked positions against the share of the block still masked."""
    labels = ("mask ratio of the block", "mean predictive entropy (nats)", "Prediction entropy vs mask ratio")
    return _line_plot(results, path, "entropy", "mask_ratio", "entropy", labels)
