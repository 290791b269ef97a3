"""Math accuracy: the fraction of completions whose final answer matches the reference (math-verify)."""

import datasets
import evaluate

from t3d_trl.evaluation.math_checker import check_math

_DESCRIPTION = """
Accuracy of math completions. The final answer of each prediction is its last \\boxed{...}
(or \\fbox{...}), else the text after its last GSM8K `####`, else, with
`fallback_to_last_number=True`, its last number. It is compared with the reference by
math-verify: `verify(parse(gold), parse(pred))`. A reference can be a GSM8K worked answer ending in
`#### N`, a MATH solution containing a \\boxed{}, a bare number or a LaTeX expression.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): model completions.
    references (`list` of `str`): reference answers or worked solutions.
    fallback_to_last_number (`bool`, default `False`): use a completion's last number when it has
        neither a \\boxed{} nor a `####` answer.
Returns:
    accuracy (`float`): fraction of predictions judged correct, in [0, 1].
    num_correct (`int`), num_samples (`int`).
Examples:
    >>> metric = evaluate.load("path/to/math_accuracy")
    >>> metric.compute(predictions=["so the answer is \\\\boxed{\\\\frac{1}{2}}"], references=["0.5"])
    {'accuracy': 1.0, 'num_correct': 1, 'num_samples': 1}
"""

_CITATION = """
@misc{math_verify,
  title = {Math-Verify: a robust mathematical expression evaluation system},
  author = {Kydl{\\'\\i}{\\v{c}}ek, Hynek and Hugging Face},
  howpublished = {\\url{https://github.com/huggingface/Math-Verify}},
  year = {2025}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MathAccuracy(evaluate.Metric):
    """Accuracy of final math answers, judged with math-verify."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
            codebase_urls=["https://github.com/huggingface/Math-Verify"],
        )

    def _compute(self, predictions, references, fallback_to_last_number=False):
        if len(predictions) == 0:
            raise ValueError("math_accuracy needs at least one prediction")
        correct = sum(
            check_math(pred, ref, fallback_to_last_number=fallback_to_last_number)
            for pred, ref in zip(predictions, references)
        )
        return {
            "accuracy": correct / len(predictions),
            "num_correct": correct,
            "num_samples": len(predictions),
        }
