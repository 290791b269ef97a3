"""Code pass@k: unbiased pass@k of sampled programs, each run against its tests in t3d-trl's sandbox."""

import datasets
import evaluate

from t3d_trl.evaluation.metrics import estimate_pass_at_k
from t3d_trl.evaluation.sandbox import check_codes

_DESCRIPTION = """
pass@k of code completions. For each task, every candidate (a program, or a completion whose code is found
by t3d-trl's default `entry_point` rule: the last fenced block that defines the function the tests call, else
unfenced code that defines it, else the last fenced block) is run with the task's tests in a separate sandboxed process
(see `t3d_trl.evaluation.sandbox`: time, memory, file-size and process limits, a private temporary
directory, destructive calls disabled). A candidate passes only if all tests pass. pass@k is the
unbiased estimator 1 - C(n-c, k) / C(n, k) averaged over tasks (Chen et al., 2021).

WARNING: this executes model-written code. The sandbox is best effort, not a security boundary:
run untrusted code inside a container or VM without network access.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `str`): for each task, its n candidates.
    references (`list` of `str`): for each task, its test code (HumanEval's `test` field, or MBPP's
        `test_imports` and `test_list` joined by newlines).
    k (`list` of `int`, default `[1]`): the k values; each must be <= the number of candidates of
        every task.
    entry_points (`list` of `str`, optional): HumanEval-style entry points; `check(<entry_point>)`
        is called after the tests.
    num_workers (`int`, optional): programs run in parallel (default: the CPUs this process may use).
    timeout (`float`, default 10.0): wall-clock seconds per program.
    memory_mb (`int`, default 1024): address-space limit per program, in MiB.
Returns:
    `pass@<k>` (`float`) for each k, and `num_tasks` (`int`).
Examples:
    >>> metric = evaluate.load("path/to/code_pass_at_k")
    >>> metric.compute(predictions=[["def f():\\n    return 1", "def f():\\n    return 2"]],
    ...                references=["assert f() == 1"], k=[1, 2])
    {'pass@1': 0.5, 'pass@2': 1.0, 'num_tasks': 1}
"""

_CITATION = """
@article{chen2021codex,
  title = {Evaluating Large Language Models Trained on Code},
  author = {Chen, Mark and Tworek, Jerry and Jun, Heewoo and Yuan, Qiming and others},
  journal = {arXiv preprint arXiv:2107.03374},
  year = {2021}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class CodePassAtK(evaluate.Metric):
    """Unbiased pass@k of sampled programs, executed in the t3d-trl sandbox."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("string")),
                    "references": datasets.Value("string"),
                }
            ),
        )

    def _compute(
        self,
        predictions,
        references,
        k=(1,),
        entry_points=None,
        num_workers=None,
        timeout=10.0,
        memory_mb=1024,
    ):
        if len(predictions) == 0:
            raise ValueError("code_pass_at_k needs at least one task")
        ks = [k] if isinstance(k, int) else list(k)
        if not ks or not all(isinstance(x, int) and x >= 1 for x in ks):
            raise ValueError(f"k must be a positive int or a list of them, got {k!r}")
        if entry_points is not None and len(entry_points) != len(predictions):
            raise ValueError(f"got {len(entry_points)} entry points for {len(predictions)} tasks")
        smallest = min(len(candidates) for candidates in predictions)
        if max(ks) > smallest:
            raise ValueError(
                f"pass@{max(ks)} needs at least {max(ks)} candidates per task; some task has {smallest}"
            )

        flat_programs, flat_tests, flat_entries, owner = [], [], [], []
        for task, (candidates, tests) in enumerate(zip(predictions, references)):
            for candidate in candidates:
                flat_programs.append(candidate)
                flat_tests.append(tests)
                flat_entries.append(None if entry_points is None else entry_points[task])
                owner.append(task)
        results = check_codes(
            flat_programs,
            flat_tests,
            flat_entries,
            num_workers=num_workers,
            timeout=timeout,
            memory_mb=memory_mb,
        )
        correct = [0] * len(predictions)
        for task, result in zip(owner, results):
            correct[task] += int(result.passed)
        scores = {}
        for value in ks:
            per_task = estimate_pass_at_k([len(c) for c in predictions], correct, value)
            scores[f"pass@{value}"] = sum(per_task) / len(per_task)
        scores["num_tasks"] = len(predictions)
        return scores
