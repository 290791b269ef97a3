"""Scoring of the demo tasks for lm-evaluation-harness: the demo's own validity check (several valid answers)."""

from t3d_trl.demo import get_task


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    return {"valid": float(get_task("sort2").is_valid(doc["prompt"], results[0]))}
