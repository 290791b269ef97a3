"""Pure metric helpers: unbiased pass@k, mean +- std over seeds, and per-run aggregates.

Aggregates work on a list of per-sample *records*, each a mapping (``dict``) or an object with
attributes (a dataclass), so they accept whatever the generation loop logs. Field names are
arguments with conventional defaults:

============  =====================================================  ==================
field         meaning                                                default key
============  =====================================================  ==================
correct       the sample's answer was judged right (bool)            ``"correct"``
num_tokens    generated (output) tokens of the sample                ``"num_tokens"``
latency       wall-clock seconds spent generating the sample         ``"latency"``
nfe           number of function (model forward) evaluations         ``"nfe"``
============  =====================================================  ==================
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "accuracy",
    "aggregate_seeds",
    "estimate_pass_at_k",
    "mean_field",
    "mean_latency",
    "mean_nfe",
    "mean_output_length",
    "mean_std",
    "pass_at_k",
    "pass_at_k_from_records",
    "pass_k_values",
    "run_metrics",
    "summarize_records",
    "throughput",
    "tokens_per_second",
]


def _check_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator ``1 - C(n-c, k) / C(n, k)`` (Chen et al., 2021).

    ``n`` samples were drawn for a task and ``c`` of them are correct; the result is the probability
    that at least one of ``k`` samples drawn without replacement from those ``n`` is correct. It is
    computed in the numerically stable product form ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``, which
    never forms the (huge) binomial coefficients.

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    n, c, k = _check_count(n, "n"), _check_count(c, "c"), _check_count(k, "k")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def estimate_pass_at_k(num_samples: int | Sequence[int], num_correct: Sequence[int], k: int) -> list[float]:
    """Per-task pass@k: ``num_samples`` is one ``n`` for all tasks or one per task."""
    correct = list(num_correct)
    samples = [num_samples] * len(correct) if isinstance(num_samples, int) else list(num_samples)
    if len(samples) != len(correct):
        raise ValueError(f"got {len(samples)} sample counts for {len(correct)} tasks")
    return [pass_at_k(n, c, k) for n, c in zip(samples, correct)]


def mean_std(values: Iterable[float], ddof: int = 1) -> tuple[float, float]:
    """Mean and standard deviation of ``values`` (e.g. one score per seed).

    ``ddof=1`` (default) gives the sample standard deviation, ``ddof=0`` the population one. With
    ``len(values) <= ddof`` (a single seed) the standard deviation is reported as ``0.0``.

    Raises:
        ValueError: on an empty input or a non-finite value.
    """
    data = [float(v) for v in values]
    if not data:
        raise ValueError("mean_std() needs at least one value")
    if not all(math.isfinite(v) for v in data):
        raise ValueError("mean_std() got a non-finite value")
    if ddof < 0:
        raise ValueError(f"ddof must be >= 0, got {ddof}")
    mean = math.fsum(data) / len(data)
    if len(data) <= ddof:
        return mean, 0.0
    variance = math.fsum((v - mean) ** 2 for v in data) / (len(data) - ddof)
    return mean, math.sqrt(variance)


def _field(record: Any, key: str) -> Any:
    if isinstance(record, Mapping):
        if key not in record:
            raise KeyError(f"record has no field {key!r} (fields: {sorted(record)})")
        return record[key]
    if not hasattr(record, key):
        raise KeyError(f"record of type {type(record).__name__} has no field {key!r}")
    return getattr(record, key)


def _values(records: Sequence[Any], key: str) -> list[float]:
    records = list(records)
    if not records:
        raise ValueError("no records to aggregate")
    values = []
    for record in records:
        value = _field(record, key)
        if isinstance(value, bool):
            value = float(value)
        if not isinstance(value, (int, float)):
            raise TypeError(f"field {key!r} must be a number or bool, got {type(value).__name__}")
        values.append(float(value))
    return values


def mean_field(records: Sequence[Any], key: str) -> float:
    """Mean of the numeric (or bool) field ``key`` over ``records``."""
    values = _values(records, key)
    return math.fsum(values) / len(values)


def accuracy(records: Sequence[Any], key: str = "correct") -> float:
    """Fraction of records whose ``key`` field is true."""
    return mean_field(records, key)


def throughput(tokens: float, seconds: float) -> float:
    """Tokens per second, ``tokens / seconds``; NaN when no time was measured (``seconds <= 0``).

    A rate over no time is undefined: NaN says so in a table and in ``results.json`` instead of failing the run
    that measured everything else. Every throughput of the package (the runner's metrics, ``Generations``,
    the lm-eval wrapper's ``decoding_stats``) is this function."""
    return tokens / seconds if seconds > 0 else float("nan")


def tokens_per_second(
    records: Sequence[Any], tokens_key: str = "num_tokens", time_key: str = "latency"
) -> float:
    """Throughput: total generated tokens divided by total generation time (not a mean of ratios); NaN when
    the total time is not positive (:func:`throughput`)."""
    return throughput(math.fsum(_values(records, tokens_key)), math.fsum(_values(records, time_key)))


def mean_latency(records: Sequence[Any], key: str = "latency") -> float:
    """Mean seconds per sample."""
    return mean_field(records, key)


def mean_nfe(records: Sequence[Any], key: str = "nfe") -> float:
    """Mean number of function evaluations (model forward passes) per sample."""
    return mean_field(records, key)


def mean_output_length(records: Sequence[Any], key: str = "num_tokens") -> float:
    """Mean generated length, in tokens, per sample."""
    return mean_field(records, key)


def pass_at_k_from_records(
    records: Sequence[Any], ks: Sequence[int] = (1,), task_key: str = "task_id", passed_key: str = "passed"
) -> dict[str, float]:
    """Mean pass@k over tasks, from one record per (task, sample).

    Records are grouped by ``task_key``; a task with ``n`` records of which ``c`` passed
    contributes :func:`pass_at_k` ``(n, c, k)``. Returns ``{"pass@1": ..., "pass@10": ...}``.

    Raises:
        ValueError: if some task has fewer samples than a requested ``k``.
    """
    counts: dict[Any, list[int]] = {}
    for record in records:
        entry = counts.setdefault(_field(record, task_key), [0, 0])
        entry[0] += 1
        entry[1] += bool(_field(record, passed_key))
    if not counts:
        raise ValueError("no records to aggregate")
    result = {}
    for k in ks:
        smallest = min(n for n, _ in counts.values())
        if k > smallest:
            raise ValueError(f"pass@{k} needs at least {k} samples per task; some task has {smallest}")
        scores = [pass_at_k(n, c, k) for n, c in counts.values()]
        result[f"pass@{k}"] = math.fsum(scores) / len(scores)
    return result


def summarize_records(
    records: Sequence[Any],
    correct_key: str = "correct",
    tokens_key: str = "num_tokens",
    time_key: str = "latency",
    nfe_key: str = "nfe",
) -> dict[str, float]:
    """The per-run table row: accuracy, tokens/s, mean latency, mean NFE and mean output length.

    A metric whose field is absent from the first record is left out of the result.
    """
    records = list(records)
    if not records:
        raise ValueError("no records to aggregate")
    first = records[0]

    def has(key: str) -> bool:
        return key in first if isinstance(first, Mapping) else hasattr(first, key)

    summary: dict[str, float] = {"num_samples": float(len(records))}
    if has(correct_key):
        summary["accuracy"] = accuracy(records, correct_key)
    if has(tokens_key) and has(time_key):
        summary["tokens_per_second"] = tokens_per_second(records, tokens_key, time_key)
    if has(time_key):
        summary["latency_per_sample"] = mean_latency(records, time_key)
    if has(nfe_key):
        summary["mean_nfe"] = mean_nfe(records, nfe_key)
    if has(tokens_key):
        summary["mean_output_length"] = mean_output_length(records, tokens_key)
    return summary


_PASS_K = (1, 5, 10, 20, 50, 100)


def run_metrics(records: Sequence[Any], pass_k: Sequence[int] = ()) -> dict[str, float]:
    """The metrics of one run (one seed) from its records (attribute access: ``SampleRecord`` objects), as
    defined in :mod:`t3d_trl.evaluation.runner`'s docstring, plus ``tokens_per_step`` and pass@k."""
    metrics = summarize_records(records)
    total_nfe = sum(r.nfe for r in records)
    if total_nfe:
        metrics["tokens_per_step"] = sum(r.num_tokens for r in records) / total_nfe
    if pass_k:
        metrics.update(pass_at_k_from_records(records, pass_k, task_key="id", passed_key="correct"))
    return metrics


def aggregate_seeds(per_seed: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean over seeds of every metric, plus ``<name>_std`` (sample standard deviation) for each; both NaN
    for a metric that is NaN in some seed (a throughput over no measured time, :func:`throughput`)."""
    metrics: dict[str, float] = {}
    for key in per_seed[0]:
        values = [run[key] for run in per_seed]
        if any(math.isnan(v) for v in values):
            mean = std = float("nan")
        else:
            mean, std = mean_std(values)
        metrics[key] = mean
        if key != "num_samples":
            metrics[f"{key}_std"] = std
    return metrics


def pass_k_values(num_samples: int, pass_k: Sequence[int] | None) -> list[int]:
    """The ``k`` of pass@k for ``num_samples`` samples per problem: ``pass_k`` checked, or by default 1, 5, 10,
    20, 50, 100 up to ``num_samples`` and ``num_samples`` itself (none for one sample)."""
    if pass_k is None:
        return sorted({k for k in _PASS_K if k <= num_samples} | {num_samples}) if num_samples > 1 else []
    bad = [k for k in pass_k if not 1 <= k <= num_samples]
    if bad:
        raise ValueError(f"pass@k needs 1 <= k <= num_samples={num_samples}, got k={bad}")
    return sorted(set(pass_k))
