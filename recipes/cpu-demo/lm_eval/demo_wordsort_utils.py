"""Scoring of the demo task wordsort for lm-evaluation-harness: the task's own validity check (two valid answers)."""

from t3d_trl.demo import get_task


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    return {"valid": float(get_task("wordsort").is_valid(doc["prompt"], results[0]))}
