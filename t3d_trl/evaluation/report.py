"""Tables and plots of an evaluation grid (:func:`t3d_trl.evaluation.runner.run_grid`).

Every function reads the grid's ``results`` list (``GridResult.results``, or ``json.load(...)["results"]`` of
a ``results.json``), so a report can be re-rendered from disk without re-running anything. Accuracies are
shown in percent, as in the paper.

* :func:`accuracy_table`: the paper's Table 1 layout: one table per decoding budget (TokPS, or a dynamic
  threshold), rows = models, columns = block length x benchmark, then the average and the gain over the
  first model.
* :func:`efficiency_table`: the paper's dynamic-decoding table: tokens/s, latency, average steps, average
  length and accuracy for every run.
* :func:`plot_accuracy_vs_tokps`, :func:`plot_accuracy_vs_throughput`: PNG plots, drawn with matplotlib's
  Agg canvas (no display, no change to the global pyplot backend).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "accuracy_table",
    "efficiency_table",
    "pass_at_k_table",
    "plot_accuracy_vs_throughput",
    "plot_accuracy_vs_tokps",
    "write_report",
]

Results = Sequence[Mapping[str, Any]]


def _unique(values: Any) -> list[Any]:
    return list(dict.fromkeys(values))


def _group(entry: Mapping[str, Any]) -> tuple[int, float]:
    """Table group of a run: static runs by TokPS first, then dynamic runs by threshold, then runs by steps."""
    setting = entry["setting"]
    if setting.get("steps") is not None:
        return (2, float(setting["steps"]))
    if setting.get("threshold") is not None:
        return (1, float(setting["threshold"]))
    return (0, float(setting["tokens_per_step"]))


def _group_title(group: tuple[int, float]) -> str:
    kind, value = group
    return (f"TokPS = {value:g}", f"Dynamic decoding, threshold {value:g}", f"Steps = {value:g}")[kind]


def _percent(entry: Mapping[str, Any], metric: str) -> str:
    metrics = entry["metrics"]
    text = f"{100 * metrics[metric]:.2f}"
    std = metrics.get(f"{metric}_std", 0.0)
    return f"{text} ± {100 * std:.2f}" if std else text


def _markdown(header: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    align = ["---" if i < numeric_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def accuracy_table(results: Results, metric: str = "accuracy") -> str:
    """Markdown tables shaped like the paper's Table 1, one per TokPS / dynamic threshold.

    Columns: ``<benchmark> (B=<block length>)`` for each block length and benchmark, ``AVG`` (mean of the
    row's cells, in percent) and ``Gain (%)`` (relative change of the mean over the first model's, the
    paper's "Gains"; ``-`` in a section where the first model has no run). Where a row lacks cells (a partial
    or merged results file), its Gain compares the two models' means over the cells both have, never averages
    over different benchmarks. With several seeds a cell reads ``mean ± std``.
    """
    if not results:
        raise ValueError("no results to tabulate")
    models = _unique(entry["model"] for entry in results)
    benchmarks = _unique(entry["benchmark"] for entry in results)
    sections = []
    for group in sorted(_unique(_group(entry) for entry in results)):
        runs = [entry for entry in results if _group(entry) == group]
        blocks = sorted(_unique(entry["setting"]["block_length"] for entry in runs))
        cells = {(e["model"], e["setting"]["block_length"], e["benchmark"]): e for e in runs}
        columns = [
            (block, bench)
            for block in blocks
            for bench in benchmarks
            if any((m, block, bench) in cells for m in models)
        ]
        header = ["Method"] + [f"{bench} (B={block})" for block, bench in columns] + ["AVG", "Gain (%)"]
        rows, reference = [], None
        for model in models:
            found = [cells.get((model, block, bench)) for block, bench in columns]
            if not any(found):
                continue
            values = [100 * e["metrics"][metric] if e is not None else None for e in found]
            average = statistics.fmean(v for v in values if v is not None)
            if model == models[0]:
                reference, gain = values, "-"
            elif reference is None:
                gain = "-"  # the baseline has no run in this section
            else:
                shared = [(v, r) for v, r in zip(values, reference) if v is not None and r is not None]
                base = statistics.fmean(r for _, r in shared) if shared else 0.0
                ours = statistics.fmean(v for v, _ in shared) if shared else 0.0
                gain = f"{100 * (ours / base - 1):+.2f}" if base > 0 else "-"
            rows.append(
                [model]
                + [_percent(e, metric) if e is not None else "–" for e in found]
                + [f"{average:.2f}", gain]
            )
        missing = "" if reference is not None else f"\n\nNo Gain: the baseline, {models[0]}, has no run here."
        sections.append(f"### {_group_title(group)}\n\n{_markdown(header, rows)}{missing}")
    return "\n\n".join(sections)


def efficiency_table(results: Results) -> str:
    """Markdown table of every run's speed: the paper's dynamic-decoding table columns."""
    header = [
        "Setting",
        "Benchmark",
        "Method",
        "TPS",
        "Latency (s)",
        "Avg steps",
        "Avg length",
        "Tokens/step",
        "Acc (%)",
    ]
    rows = []
    for entry in sorted(results, key=lambda e: (_group(e), e["setting"]["block_length"], e["benchmark"])):
        m = entry["metrics"]
        rows.append(
            [
                entry["setting"]["label"],
                entry["benchmark"],
                entry["model"],
                f"{m['tokens_per_second']:.2f}",
                f"{m['latency_per_sample']:.3f}",
                f"{m['mean_nfe']:.2f}",
                f"{m['mean_output_length']:.2f}",
                f"{m.get('tokens_per_step', math.nan):.2f}",
                _percent(entry, "accuracy"),
            ]
        )
    return _markdown(header, rows, numeric_from=3)


def pass_at_k_table(results: Results) -> str | None:
    """Markdown table of pass@k (percent) for the runs that sampled several completions, else ``None``."""
    ks = sorted(
        {
            int(key[5:])
            for e in results
            for key in e["metrics"]
            if key.startswith("pass@") and not key.endswith("_std")
        }
    )
    runs = [e for e in results if any(key.startswith("pass@") for key in e["metrics"])]
    if not runs:
        return None
    header = ["Setting", "Benchmark", "Method"] + [f"pass@{k}" for k in ks]
    rows = [
        [e["setting"]["label"], e["benchmark"], e["model"]]
        + [_percent(e, f"pass@{k}") if f"pass@{k}" in e["metrics"] else "–" for k in ks]
        for e in runs
    ]
    return _markdown(header, rows, numeric_from=3)


def _averages(results: Results, metric: str) -> dict[tuple[str, str], float]:
    """(model, setting label) -> mean of ``metric`` over benchmarks."""
    sums: dict[tuple[str, str], list[float]] = {}
    for entry in results:
        sums.setdefault((entry["model"], entry["setting"]["label"]), []).append(entry["metrics"][metric])
    return {key: sum(values) / len(values) for key, values in sums.items()}


def _figure(ncols: int, width: float = 4.5) -> tuple[Any, list[Any]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width * ncols, 3.6), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, [figure.add_subplot(1, ncols, i + 1) for i in range(ncols)]


def plot_accuracy_vs_tokps(results: Results, path: str | Path) -> Path | None:
    """Mean accuracy over benchmarks against TokPS, one line per model, one panel per block length.

    Only static runs have a TokPS; returns ``None`` (and writes nothing) when there are none.
    """
    static = [
        e for e in results if e["setting"].get("threshold") is None and e["setting"].get("steps") is None
    ]
    if not static:
        return None
    accuracy = _averages(static, "accuracy")
    models = _unique(e["model"] for e in static)
    blocks = sorted(_unique(e["setting"]["block_length"] for e in static))
    figure, axes = _figure(len(blocks))
    for ax, block in zip(axes, blocks):
        runs = [e for e in static if e["setting"]["block_length"] == block]
        for model in models:
            points = sorted(
                {
                    (e["setting"]["tokens_per_step"], accuracy[(model, e["setting"]["label"])])
                    for e in runs
                    if e["model"] == model
                }
            )
            if points:
                ax.plot([x for x, _ in points], [100 * y for _, y in points], marker="o", label=model)
        ax.set_xticks(sorted(_unique(e["setting"]["tokens_per_step"] for e in runs)))
        ax.set_title(f"block length {block}")
        ax.set_xlabel("tokens per step (TokPS)")
        ax.set_ylabel("accuracy (%), mean over benchmarks")
        ax.grid(alpha=0.3)
    axes[0].legend()
    path = Path(path)
    figure.savefig(path, dpi=120)
    return path


def plot_accuracy_vs_throughput(results: Results, path: str | Path) -> Path:
    """Mean accuracy against mean tokens per second (over benchmarks), one series per model, points labelled."""
    if not results:
        raise ValueError("no results to plot")
    accuracy = _averages(results, "accuracy")
    throughput = _averages(results, "tokens_per_second")
    figure, (ax,) = _figure(1, width=6.4)
    for model in _unique(e["model"] for e in results):
        labels = _unique(e["setting"]["label"] for e in results if e["model"] == model)
        xs = [throughput[(model, label)] for label in labels]
        ys = [100 * accuracy[(model, label)] for label in labels]
        ax.scatter(xs, ys, label=model)
        for x, y, label in zip(xs, ys, labels):
            ax.annotate(label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("throughput (output tokens / s), mean over benchmarks")
    ax.set_ylabel("accuracy (%), mean over benchmarks")
    ax.grid(alpha=0.3)
    ax.legend()
    path = Path(path)
    figure.savefig(path, dpi=120)
    return path


def write_report(results: Results, output_dir: str | Path) -> dict[str, Path]:
    """Write ``table.md`` and the two plots into ``output_dir``; returns what was written, by kind."""
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    parts = [
        "# Evaluation results",
        "## Accuracy (%)",
        accuracy_table(results),
        "## Speed",
        efficiency_table(results),
    ]
    pass_k = pass_at_k_table(results)
    if pass_k is not None:
        parts += ["## pass@k (%)", pass_k]
    written = {"table": output / "table.md"}
    written["table"].write_text("\n\n".join(parts) + "\n")
    tokps = plot_accuracy_vs_tokps(results, output / "accuracy_vs_tokps.png")
    if tokps is not None:
        written["accuracy_vs_tokps"] = tokps
    written["accuracy_vs_throughput"] = plot_accuracy_vs_throughput(
        results, output / "accuracy_vs_throughput.png"
    )
    return written
