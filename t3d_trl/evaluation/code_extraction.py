"""Cutting the code out of a model's completion, and finding the function a test suite calls.

Two rules (see ``docs/evaluation_checkers.md`` for what each recovers): ``"entry_point"`` (evalplus-like,
the default) and ``"last_block"`` (the paper's rule). The sandbox (:mod:`t3d_trl.evaluation.sandbox`)
runs what these functions find; its module re-exports them under their old import path.
"""

from __future__ import annotations

import ast
import bisect
import builtins
import re
from collections.abc import Sequence
from typing import Literal

__all__ = [
    "CODE_EXTRACTION_RULES",
    "CodeExtraction",
    "completion_code",
    "entry_point_from_tests",
    "extract_code",
]

_PYTHON_TAGS = {"python", "py", "python3", "py3"}
#: How code is cut out of a completion (:func:`extract_code`): evalplus-like, or the paper's last block.
CODE_EXTRACTION_RULES = ("entry_point", "last_block")
CodeExtraction = Literal["entry_point", "last_block"]
# A fence opens with three or more backticks (anywhere on a line, as models write them; no backtick in its info
# string) or tildes (at the start of a line, so that prose's ``~~~`` is not one). A backtick fence closes at the
# next run of at least as many backticks (anywhere: models often close on the code's last line); a tilde fence
# only on a line of its own, as CommonMark closes every fence. The blanks before an opening fence that starts its
# line are its indent (a fence nested in a list item).
_FENCE_OPEN_RE = re.compile(
    r"(?P<indent>^[ \t]*)?(?P<fence>`{3,})(?P<info>[^\n`]*)\n|^(?P<indent2>[ \t]*)(?P<fence2>~{3,})(?P<info2>[^\n]*)\n",
    re.MULTILINE,
)


def _closing_fence(completion: str, fence: str, start: int) -> tuple[int, int] | None:
    """``(start, end)`` of the fence that closes ``fence`` after ``start``; ``None`` when it is not closed. A
    backtick fence consumes only its own length of a longer run (a closing and an opening fence written together,
    ``````` ``````python ```````, are two)."""
    if fence[0] == "`":
        # A longer fence left unclosed is closed by a shorter run: models open with four and close with three.
        for length in dict.fromkeys((len(fence), 3)):
            closing = re.compile(f"`{{{length},}}").search(completion, start)
            if closing is not None:
                return closing.start(), closing.start() + length
        return None
    closing = re.compile(rf"^[ \t]*~{{{len(fence)},}}[ \t]*$", re.MULTILINE).search(completion, start)
    return None if closing is None else closing.span()


def _unindent(body: str, indent: int) -> str:
    """``body`` with up to ``indent`` leading blanks removed from each line, as CommonMark reads a fence
    indented by ``indent``: its content is indented as much. Not a full dedent: a HumanEval body in an
    unindented fence keeps the indent that makes it continue the prompt's function."""
    if not indent:
        return body
    return "\n".join(line[min(indent, len(line) - len(line.lstrip(" \t"))) :] for line in body.split("\n"))


def _fenced_blocks(completion: str) -> list[tuple[str, str]]:
    """``(language tag, body)`` of every fenced block (backticks or tildes), in order; an unclosed last fence
    runs to the end. The body of an indented fence loses that indent (:func:`_unindent`)."""
    blocks: list[tuple[str, str]] = []
    position = 0
    while (opening := _FENCE_OPEN_RE.search(completion, position)) is not None:
        fence = opening.group("fence") or opening.group("fence2")
        indent = opening.group("indent") or opening.group("indent2") or ""
        info = opening.group("info") if opening.group("fence") else opening.group("info2")
        closing = _closing_fence(completion, fence, opening.end())
        if closing is None and fence[0] == "~" and _FENCE_OPEN_RE.search(completion, opening.end()):
            position = opening.end()  # a "~~~" line that opens nothing before a later fence: prose
            continue
        body = completion[opening.end() : closing[0] if closing else len(completion)]
        blocks.append((info.strip().lower(), _unindent(body, len(indent))))
        if closing is None:
            break
        position = closing[1]
    return blocks


def _has_fence(completion: str) -> bool:
    """Whether ``completion`` holds a fence, even one that opens no block (no line after it)."""
    return "```" in completion or re.search(r"^[ \t]*~~~", completion, re.MULTILINE) is not None


def _parses(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _defines(code: str, entry_point: str, tree: ast.Module | None = None) -> bool:
    """Whether ``code`` (parsed: ``tree``) defines ``entry_point`` at top level (a function, a class or
    ``name = ...``)."""
    tree = tree or _parses(code)
    if tree is None:  # a block cut at the token budget: look for the definition line itself
        return (
            re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None
        )
    for node in tree.body:
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.name == entry_point
        ):
            return True
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == entry_point for target in node.targets
        ):
            return True
    return False


#: What one search for a parsing run may spend in the parser, in characters parsed into a tree (about 1 s of
#: ``ast.parse``); a run that fails is charged the characters up to its error plus a fiftieth of the rest
#: (reading them). The search tries many runs, and a long degenerate completion must not stall an evaluation.
PARSE_BUDGET = 1_000_000


def _longest_parsing_run(text: str, entry_point: str | None) -> str | None:
    """The run of consecutive lines with the most non-blank lines that parses as Python (and, given
    ``entry_point``, defines it), as evalplus's sanitizer finds code in prose; ``None`` if there is none.

    The search stops with the best run found so far once it has parsed :data:`PARSE_BUDGET` characters."""
    lines = text.splitlines()
    # A run that defines the entry point holds the line that starts its definition (as _defines reads it).
    if entry_point is None:
        defining = list(range(len(lines)))
    else:
        name = re.escape(entry_point)
        pattern = re.compile(rf"(?:async\s+def|def|class)\s+{name}\b|(?:[A-Za-z_]\w*\s*=\s*)*{name}\s*=(?!=)")
        defining = [k for k, line in enumerate(lines) if pattern.match(line)]
    budget = PARSE_BUDGET
    weight, chars = [0], [0]
    for line in lines:
        weight.append(weight[-1] + bool(line.strip()))
        chars.append(chars[-1] + len(line) + 1)
    best, best_weight = None, 0
    for i, line in enumerate(lines):
        first = bisect.bisect_left(defining, i)
        if first == len(defining):
            break
        # A module cannot start indented or blank, and a shorter run cannot beat the best one.
        if not line.strip() or line[0].isspace() or weight[-1] - weight[i] <= best_weight:
            continue
        for j in range(len(lines), defining[first], -1):
            if weight[j] - weight[i] <= best_weight:
                break
            code = "\n".join(lines[i:j]).rstrip() + "\n"
            try:
                tree, error = ast.parse(code), j
            except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
                tree, error = None, min(j, i + (getattr(err, "lineno", None) or j - i))
            budget -= chars[error] - chars[i] + (chars[j] - chars[error]) // 50
            if budget < 0:
                return best
            if tree is not None and (entry_point is None or _defines(code, entry_point, tree)):
                best, best_weight = code, weight[j] - weight[i]
                break
    return best


def extract_code(
    completion: str, entry_point: str | None = None, rule: CodeExtraction = "entry_point"
) -> str | None:
    """The code of a completion, by one of two rules (see ``docs/evaluation_checkers.md`` for what each recovers).

    * ``"entry_point"`` (default, evalplus-like): the last fenced block that defines ``entry_point`` at top
      level; else the longest run of lines of the text that parses and defines it (code in prose without a
      fence); else the last fenced block as below. Without ``entry_point``: the last fenced block, else the
      longest run of lines that parses.
    * ``"last_block"`` (the paper's rule): the last block tagged ``python``/``py``/``python3``, else the
      last fenced block of any language; ``None`` without a fence.

    An unclosed fence at the end (a completion cut at its token budget) counts as a block that runs to the
    end of the text. Returns ``None`` when the rule finds no code.
    """
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}")
    if rule not in CODE_EXTRACTION_RULES:
        raise ValueError(f"rule must be one of {CODE_EXTRACTION_RULES}, got {rule!r}")
    if entry_point is not None and not (isinstance(entry_point, str) and entry_point.isidentifier()):
        raise ValueError(f"entry_point must be a Python identifier, got {entry_point!r}")
    blocks = _fenced_blocks(completion)
    if rule == "entry_point":
        if entry_point is not None:
            defining = [body for _, body in blocks if _defines(body, entry_point)]
            if defining:
                return defining[-1]
            run = _longest_parsing_run(completion, entry_point)
            if run is not None:
                return run
        elif not blocks:
            return _longest_parsing_run(completion, None)
    if not blocks:
        return None
    for tag, body in reversed(blocks):
        if tag in _PYTHON_TAGS:
            return body
    return blocks[-1][1]


def entry_point_from_tests(tests: str | Sequence[str]) -> str | None:
    """The function that MBPP-style ``assert`` tests call: the first called name that is not a builtin, else
    the first called name (a solution may shadow a builtin: MBPP asks for a ``sum(a, b)``).

    ``["assert set(similar(1, 2)) == {3}"]`` -> ``"similar"``; ``None`` when the tests call no function by name
    (or do not parse).
    """
    source = tests if isinstance(tests, str) else "\n".join(tests)
    tree = _parses(source)
    if tree is None:
        return None
    called = [
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    ]
    return next((name for name in called if not hasattr(builtins, name)), called[0] if called else None)


def completion_code(
    completion: str,
    entry_point: str | None = None,
    rule: CodeExtraction = "entry_point",
) -> str | None:
    """The program to run for a completion: :func:`extract_code`, or the text itself when it has no fence
    and the rule finds nothing (a bare program, or a HumanEval body that only parses after its prompt)."""
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a str, got {type(completion).__name__}")
    code = extract_code(completion, entry_point, rule)
    if code is None and not _has_fence(completion):
        return completion
    return code
