"""pass@k, mean/std, record aggregates, and the shipped `evaluate` metric modules."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

import pytest

from t3d_trl.evaluation.metrics import (
    accuracy,
    aggregate_seeds,
    estimate_pass_at_k,
    mean_latency,
    mean_nfe,
    mean_output_length,
    mean_std,
    pass_at_k,
    pass_at_k_from_records,
    summarize_records,
    throughput,
    tokens_per_second,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 1, 1, 0.1),
        (10, 5, 1, 0.5),
        (10, 5, 2, 1 - 10 / 45),  # 1 - C(5,2)/C(10,2)
        (5, 0, 3, 0.0),
        (5, 5, 5, 1.0),
        (5, 3, 3, 1.0),  # n - c < k: every draw of 3 contains a correct sample
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (20, 2, 10, 1 - Fraction(43758, 184756)),  # 1 - C(18,10)/C(20,10) = 1 - 9/38
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-12)


def _brute_force(n: int, c: int, k: int) -> Fraction:
    samples = [True] * c + [False] * (n - c)
    draws = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in draw) for draw in draws), len(draws))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_matches_enumeration(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(_brute_force(n, c, k)), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n() -> None:
    n, c, k = 1000, 7, 100
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert estimate_pass_at_k(1000, [0, 7, 1000], 100) == pytest.approx([0.0, float(exact), 1.0])
    assert estimate_pass_at_k([2, 4], [1, 2], 1) == pytest.approx([0.5, 0.5])


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_rejects_bad_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_pass_at_k_rejects_non_integers() -> None:
    with pytest.raises(TypeError):
        pass_at_k(10.0, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        estimate_pass_at_k([1, 2], [1], 1)


def test_mean_std() -> None:
    mean, std = mean_std([0.5, 0.6, 0.7])
    assert mean == pytest.approx(0.6) and std == pytest.approx(0.1)
    assert mean_std([2.0, 4.0], ddof=0) == pytest.approx((3.0, 1.0))
    assert mean_std([3.0]) == (3.0, 0.0)
    with pytest.raises(ValueError):
        mean_std([])
    with pytest.raises(ValueError):
        mean_std([1.0, float("nan")])


@dataclass
class Sample:
    correct: bool
    num_tokens: int
    latency: float
    nfe: int


RECORDS = [
    {"correct": True, "num_tokens": 100, "latency": 1.0, "nfe": 4},
    {"correct": False, "num_tokens": 300, "latency": 3.0, "nfe": 8},
    {"correct": True, "num_tokens": 200, "latency": 1.0, "nfe": 6},
    {"correct": True, "num_tokens": 0, "latency": 1.0, "nfe": 2},
]


@pytest.mark.parametrize("records", [RECORDS, [Sample(**r) for r in RECORDS]], ids=["dicts", "dataclasses"])
def test_record_aggregates(records: list) -> None:
    assert accuracy(records) == 0.75
    assert tokens_per_second(records) == pytest.approx(600 / 6.0)
    assert mean_latency(records) == pytest.approx(1.5)
    assert mean_nfe(records) == pytest.approx(5.0)
    assert mean_output_length(records) == pytest.approx(150.0)
    summary = summarize_records(records)
    assert summary == pytest.approx(
        {
            "num_samples": 4.0,
            "accuracy": 0.75,
            "tokens_per_second": 100.0,
            "latency_per_sample": 1.5,
            "mean_nfe": 5.0,
            "mean_output_length": 150.0,
        }
    )


def test_record_aggregates_errors() -> None:
    with pytest.raises(ValueError):
        accuracy([])
    with pytest.raises(KeyError, match="correct"):
        accuracy([{"passed": True}])
    with pytest.raises(TypeError):
        mean_nfe([{"nfe": "four"}])
    assert math.isnan(tokens_per_second([{"num_tokens": 3, "latency": 0.0}]))  # no measured time
    assert summarize_records([{"correct": False}]) == {"num_samples": 1.0, "accuracy": 0.0}


def test_throughput_is_nan_without_measured_time() -> None:
    assert throughput(6, 2.0) == 3.0
    assert math.isnan(throughput(6, 0.0)) and math.isnan(throughput(0, -1.0))
    # A seed without measured time makes the mean NaN instead of failing the whole aggregate.
    aggregated = aggregate_seeds(
        [{"accuracy": 0.5, "tokens_per_second": 2.0}, {"accuracy": 1.0, "tokens_per_second": math.nan}]
    )
    assert aggregated["accuracy"] == 0.75 and math.isnan(aggregated["tokens_per_second"])
    assert math.isnan(aggregated["tokens_per_second_std"])


def test_pass_at_k_from_records() -> None:
    records = [{"task_id": "a", "passed": p} for p in (True, False, False, False)]
    records += [{"task_id": "b", "passed": p} for p in (True, True, False, False)]
    scores = pass_at_k_from_records(records, ks=(1, 2))
    assert scores["pass@1"] == pytest.approx((0.25 + 0.5) / 2)
    assert scores["pass@2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)
    with pytest.raises(ValueError, match="pass@5"):
        pass_at_k_from_records(records, ks=(5,))


# ------------------------------------------------------------------------------------------------
# The evaluate metric modules, loaded offline by path.
# ------------------------------------------------------------------------------------------------
@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def test_math_accuracy_module(offline: None) -> None:
    import evaluate

    from t3d_trl.evaluation.metric_modules import load_metric, metric_path

    metric = evaluate.load(metric_path("math_accuracy"))
    result = metric.compute(
        predictions=[r"so \boxed{\frac{1}{2}}", "#### 1,234", r"\boxed{7}", "no answer"],
        references=["0.5", "She has 1234 left.\n#### 1234", r"$\boxed{8}$", "3"],
    )
    assert result == {"accuracy": 0.5, "num_correct": 2, "num_samples": 4}
    by_name = load_metric("math_accuracy")
    assert by_name.compute(predictions=["It is 3."], references=["3"], fallback_to_last_number=True)[
        "accuracy"
    ] == pytest.approx(1.0)


def test_code_pass_at_k_module(offline: None) -> None:
    from t3d_trl.evaluation.metric_modules import load_metric

    metric = load_metric("code_pass_at_k")
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    bad = "```python\ndef add(a, b):\n    return a - b\n```"
    loop = "def add(a, b):\n    while True:\n        pass\n"
    result = metric.compute(
        predictions=[[good, bad, bad, loop], [good, good, good, bad]],
        references=["assert add(1, 2) == 3", "def check(candidate):\n    assert candidate(2, 2) == 4\n"],
        entry_points=[None, "add"],
        k=[1, 2],
        timeout=3.0,
        num_workers=8,
    )
    assert result["num_tasks"] == 2
    assert result["pass@1"] == pytest.approx((0.25 + 0.75) / 2)
    assert result["pass@2"] == pytest.approx((pass_at_k(4, 1, 2) + pass_at_k(4, 3, 2)) / 2)
    with pytest.raises(ValueError, match="pass@5"):
        metric.compute(predictions=[[good]], references=["pass"], k=[5])


def test_unknown_metric_name() -> None:
    from t3d_trl.evaluation.metric_modules import load_metric

    with pytest.raises(ValueError, match="available"):
        load_metric("bleu")
