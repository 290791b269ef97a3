"""Math answer extraction and equivalence checking built on ``math-verify``.

The checker works in two steps:

1. **Extraction.** The final answer of a completion is the content of its last ``\\boxed{...}``
   (or ``\\fbox{...}``) with balanced braces; failing that, the text after the last GSM8K ``####``
   marker; failing that, and only when asked (``fallback_to_last_number=True``), the last number in
   the text. References are read the same way: a GSM8K worked answer ending in ``#### N`` gives
   ``N``, a reference with a ``\\boxed{}`` gives its content, anything else is used as it is.
2. **Comparison.** Both answers are lightly normalised (dollar signs, thousands separators,
   trailing periods, plain-text units such as ``5 dollars``) and compared with
   ``math_verify.verify(parse(gold), parse(pred))``, which understands LaTeX fractions, roots,
   percentages, intervals, tuples, sets, equations and ``\\text{}`` units.

``math-verify`` bounds its own run time with ``signal.alarm``, which only works in the main
thread. Outside the main thread this module calls it with the timeouts disabled
(``parsing_timeout=None`` / ``timeout_seconds=None``), so every function here is safe to call from
worker threads; in that case a pathological expression (say ``9^{9^{9^{9}}}``) is not interrupted.
"""

from __future__ import annotations

import re
import threading

from math_verify import parse, verify

__all__ = [
    "check_math",
    "extract_answer",
    "extract_boxed",
    "extract_gsm8k_answer",
    "extract_last_number",
    "math_equal",
    "normalize_answer",
    "reference_answer",
]

#: Time limit (seconds) that math-verify applies in the main thread, for parsing and for verifying.
MAIN_THREAD_TIMEOUT_S = 5

_BOXED_COMMANDS = ("\\boxed", "\\fbox")
_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+"
_LAST_NUMBER_RE = re.compile(rf"(?:{_NUMBER})(?:\s*/\s*\d+)?")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
# "12 apples", "5 dollars.", "3.5 cm": a number followed by plain words only (no LaTeX).
_NUMBER_WITH_WORDS_RE = re.compile(rf"^({_NUMBER})\s*((?:[A-Za-z]{{2,}}\.?\s*)+)$")
_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm)\{([^{}]*)\}")
# Words that change the value rather than name a unit: "3 million" is not 3, nor "2 squared".
_NOT_UNITS = {"pi", "sqrt", "frac", "i", "e"} | {
    *("hundred", "hundreds", "thousand", "thousands", "million", "millions", "billion", "billions"),
    *("trillion", "trillions", "dozen", "dozens", "squared", "cubed"),
}
# A digit group separator inside one number: ``,`` plus LaTeX spacing (``11,\\! 111``, ``10,\\,080``),
# ``{,}`` (``1{,}000``) or LaTeX spacing alone (``1\\,000\\,000``), before exactly three digits. A bare
# ``, `` is left alone: ``3, 5, 7`` is a list.
_SPACE = r"(?:\\[!,;:> ]|~)"
_GROUP_SEPARATOR_RE = re.compile(rf"(?<=\d)(?:,{_SPACE}+\s*|\{{,\}}|{_SPACE}+)(?=\d{{3}}(?!\d))")


def _require_str(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def _boxed_spans(text: str) -> list[tuple[int, str]]:
    """All ``\\boxed``/``\\fbox`` arguments of ``text`` as ``(start, content)``, in order."""
    spans: list[tuple[int, str]] = []
    for command in _BOXED_COMMANDS:
        start = text.find(command)
        while start != -1:
            pos = start + len(command)
            # Skip commands that merely start with the name (e.g. a hypothetical \boxedsymbol).
            if pos < len(text) and text[pos].isalpha():
                start = text.find(command, pos)
                continue
            while pos < len(text) and text[pos] == " ":
                pos += 1
            if pos < len(text) and text[pos] == "{":
                depth = 0
                for end in range(pos, len(text)):
                    char = text[end]
                    if char == "{" and text[end - 1] != "\\":
                        depth += 1
                    elif char == "}" and text[end - 1] != "\\":
                        depth -= 1
                        if depth == 0:
                            spans.append((start, text[pos + 1 : end]))
                            break
            elif pos > start + len(command):
                # "\boxed 5": the argument is the next whitespace-free token.
                match = re.match(r"[^\s$]+", text[pos:])
                if match:
                    spans.append((start, match.group(0)))
            start = text.find(command, start + len(command))
    spans.sort(key=lambda span: span[0])
    return spans


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` in ``text`` (balanced braces).

    Also accepts the brace-less form ``\\boxed 5``. Returns ``None`` when there is no complete box
    (an unclosed ``\\boxed{`` at the end of a truncated completion does not count).
    """
    _require_str(text, "text")
    spans = _boxed_spans(text)
    return spans[-1][1].strip() if spans else None


def extract_gsm8k_answer(text: str) -> str | None:
    """The answer after the last GSM8K ``####`` marker, e.g. ``"#### 1,234"`` -> ``"1234"``.

    When the rest of the line starts with a number (possibly after ``$``), only that number is
    kept, without thousands separators; otherwise the rest of the line is returned stripped.
    Returns ``None`` when there is no ``####`` or nothing follows it.
    """
    _require_str(text, "text")
    index = text.rfind("####")
    if index == -1:
        return None
    rest = text[index + 4 :].strip().splitlines()
    if not rest or not rest[0].strip():
        return None
    line = rest[0].strip()
    match = re.match(rf"^\\?\$?\s*({_NUMBER})", line)
    if match:
        return match.group(1).replace(",", "")
    return line.rstrip(".").strip() or None


def extract_last_number(text: str) -> str | None:
    """The last number in ``text`` (integers, decimals, ``a/b`` fractions), without ``,`` separators."""
    _require_str(text, "text")
    matches = _LAST_NUMBER_RE.findall(text)
    if not matches:
        return None
    return re.sub(r"\s+", "", matches[-1]).replace(",", "")


def extract_answer(text: str, *, fallback_to_last_number: bool = False) -> str | None:
    """Final answer of a completion: last ``\\boxed{}``, else GSM8K ``####``, else (optionally) last number."""
    _require_str(text, "text")
    answer = extract_boxed(text)
    if answer is None:
        answer = extract_gsm8k_answer(text)
    if answer is None and fallback_to_last_number:
        answer = extract_last_number(text)
    return answer


def normalize_answer(answer: str) -> str:
    """Light, conservative normalisation applied before math-verify parsing.

    Strips surrounding ``$...$`` / ``\\(...\\)``, currency signs, a trailing period, ``\\!`` spacing,
    digit group separators inside a number (``11,\\! 111,\\! 100`` and ``1{,}000`` -> one number; a
    lone ``1,234`` -> ``1234``), a ``\\text{}`` wrapping the whole answer, and plain-text units after a lone
    number (``5 dollars`` -> ``5``; not ``3 million``). LaTeX
    content is otherwise left to math-verify. Group separators go first: once ``\\!`` is gone,
    ``11, 111, 100`` would read as the set {11, 100, 111}.
    """
    _require_str(answer, "answer")
    text = answer.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right):
            text = text[len(left) : -len(right)].strip()
    text = _GROUP_SEPARATOR_RE.sub("", text)
    text = text.replace("\\!", "").replace("\\$", "").replace("\\,", "")
    text = re.sub(r"^\$\s*", "", text).strip()
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1].rstrip()
    wrapped = _TEXT_WRAPPER_RE.fullmatch(text)  # \text{18 dollars}: the whole answer in one text command
    if wrapped:
        text = wrapped.group(1).strip()
    match = _NUMBER_WITH_WORDS_RE.match(text)
    if match and not set(match.group(2).lower().replace(".", " ").split()) & _NOT_UNITS:
        text = match.group(1)
    if _THOUSANDS_RE.match(text):
        text = text.replace(",", "")
    return text.strip()


def _timeouts() -> int | None:
    """math-verify's signal-based timeouts only work in the main thread; disable them elsewhere."""
    return MAIN_THREAD_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse(answer: str, timeout: int | None) -> list:
    parsed = parse(f"${answer}$", parsing_timeout=timeout)
    if not parsed:
        # Plain expressions that are not valid LaTeX math (rare): let math-verify try them raw.
        parsed = parse(answer, parsing_timeout=timeout)
    return parsed


def math_equal(gold: str, pred: str) -> bool:
    """Whether two final answers are mathematically equivalent (``gold`` first: math-verify is asymmetric).

    Both arguments are answers, not whole solutions: ``"\\frac{1}{2}"`` and ``"0.5"``, ``"1,234"``
    and ``"1234"``, ``"10\\text{ cm}"`` and ``"10"`` are equal. Empty answers are never equal.
    """
    gold = normalize_answer(_require_str(gold, "gold"))
    pred = normalize_answer(_require_str(pred, "pred"))
    if not gold or not pred:
        return False
    if gold == pred:
        return True
    timeout = _timeouts()
    gold_parsed = _parse(gold, timeout)
    pred_parsed = _parse(pred, timeout)
    if not gold_parsed or not pred_parsed:
        return False
    try:
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))
    except Exception:  # math-verify raises only on internal errors; treat them as "not equal"
        return False


def reference_answer(gold: str) -> str:
    """The answer contained in a reference: GSM8K ``#### N``, a ``\\boxed{}``, or the text itself."""
    _require_str(gold, "gold")
    if "####" in gold:
        answer = extract_gsm8k_answer(gold)
        if answer is not None:
            return answer
    boxed = extract_boxed(gold)
    return boxed if boxed is not None else gold.strip()


def check_math(completion: str, gold: str, *, fallback_to_last_number: bool = False) -> bool:
    """Whether a model completion's final answer matches the reference ``gold``.

    Args:
        completion: the model's full output; its answer is found with :func:`extract_answer`.
        gold: a GSM8K worked answer ending in ``#### N``, a solution with a ``\\boxed{}``, a bare
            number or a LaTeX expression.
        fallback_to_last_number: if the completion has neither a box nor ``####``, use its last
            number instead of judging it wrong.
    """
    _require_str(completion, "completion")
    pred = extract_answer(completion, fallback_to_last_number=fallback_to_last_number)
    if pred is None:
        return False
    return math_equal(reference_answer(gold), pred)
