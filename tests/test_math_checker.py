"""Answer extraction and math-verify based equivalence (t3d_trl.evaluation.math_checker)."""

from __future__ import annotations

import functools
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sympy
from math_verify import parse, verify

from t3d_trl.evaluation.math_checker import (
    check_math,
    extract_answer,
    extract_boxed,
    extract_gsm8k_answer,
    extract_last_number,
    math_equal,
    normalize_answer,
    reference_answer,
)

# (gold, prediction, expected verdict)
ANSWER_PAIRS = [
    # fractions and decimals
    (r"\frac{1}{2}", "0.5", True),
    ("0.5", r"\frac12", True),
    (r"\dfrac{3}{4}", "0.75", True),
    (r"-\frac{1}{2}", "-0.5", True),
    ("1.5", r"\frac{3}{2}", True),
    (r"3\frac{1}{2}", "3.5", True),
    ("1/3", "0.3333333", True),
    ("5", "5.0", True),
    # LaTeX
    (r"2\sqrt{2}", r"\sqrt{8}", True),
    (r"\frac{\sqrt{2}}{2}", r"\sqrt{2}/2", True),
    ("(x+1)^2", "x^2+2x+1", True),
    (r"\infty", r"\infty", True),
    (r"\pi", r"\pi", True),
    # intervals, tuples, sets
    ("(0,1]", "(0, 1]", True),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\pi/2)", True),
    (r"\{1,2\}", r"\{2,1\}", True),
    ("[2,5]", r"x \in [2,5]", True),
    # units, currency, percentages, equations, choices
    (r"10\text{ cm}", "10", True),
    ("10", "10 cm", True),
    ("18", "18 dollars", True),
    ("18", r"\text{18 dollars}", True),
    (r"\$5", "5", True),
    ("5", "$5.00", True),
    (r"30^\circ", "30", True),
    (r"50\%", "50", True),
    ("0.25", r"25\%", True),
    ("5", "x = 5", True),
    (r"\text{(C)}", "C", True),
    # GSM8K-style numbers
    ("#### 1,234", "1234", True),
    ("1234", "1,234", True),
    ("1,000", "1000.0", True),
    (r"\$1,234.50", "1234.5", True),
    ("-7", "-7", True),
    # negative cases: must be judged wrong
    ("-3", "3", False),
    (r"\frac{1}{2}", "-0.5", False),
    (r"\frac{3}{4}", "0.76", False),
    ("12", "12.5", False),
    ("(0,1)", "[0,1]", False),
    ("[1,2)", "[1,2]", False),
    ("3.14", r"\pi", False),
    (r"\sqrt{3}", "1.732", False),
    ("x+1", "x-1", False),
    (r"\text{(C)}", "(B)", False),
    ("#### 1,234", "1243", False),
    ("3", "3 million", False),  # a magnitude word changes the value: not a unit to strip
    ("5", "5 hundred", False),
    ("2", "2 squared", False),
    ("1234", "", False),
    # digit groups with LaTeX spacing (MATH500 item 217 and its kind)
    (r"11,\! 111,\! 111,\! 100", "11111111100", True),
    (r"11,\! 111,\! 111,\! 100", "11,111,111,100", True),
    (r"11,\! 111,\! 111,\! 100", "100, 111, 11", False),
    (r"10,\!080", "10080", True),
    (r"\$32,\!348", "32348", True),
    ("1000000", r"1\,000\,000", True),
    ("1000", "1{,}000", True),
    ("3, 5, 7", "357", False),
    ("3, 5, 7", "7, 5, 3", True),
]


@pytest.mark.parametrize(("gold", "pred", "expected"), ANSWER_PAIRS)
def test_answer_pairs(gold: str, pred: str, expected: bool) -> None:
    assert math_equal(reference_answer(gold), pred) is expected


def test_table_is_large_enough() -> None:
    assert len(ANSWER_PAIRS) >= 30
    assert sum(not expected for *_, expected in ANSWER_PAIRS) >= 10


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"first \boxed{1} then \boxed{\frac{a}{b}}", r"\frac{a}{b}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"nested \boxed{\sqrt{\frac{1}{2}}} end", r"\sqrt{\frac{1}{2}}"),
        (r"\fbox{7}", "7"),
        (r"\boxed 5 is it", "5"),
        (r"\boxed{3} and later \fbox{4}", "4"),
        (r"unclosed \boxed{12", None),
        ("no box here", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_extract_gsm8k_and_last_number() -> None:
    assert extract_gsm8k_answer("She pays 3 * 4 = 12.\n#### 1,234") == "1234"
    assert extract_gsm8k_answer("#### $18.50 dollars") == "18.50"
    assert extract_gsm8k_answer("#### -5\n") == "-5"
    assert extract_gsm8k_answer("no marker") is None
    assert extract_gsm8k_answer("#### ") is None
    assert extract_last_number("3 apples and 1,250.5 pears, then 7/8") == "7/8"
    assert extract_last_number("from 3 to -4.") == "-4"
    assert extract_last_number("none") is None


def test_extract_answer_priority_and_fallback() -> None:
    text = "#### 3\nActually \\boxed{4}"
    assert extract_answer(text) == "4"
    assert extract_answer("The answer is 17.") is None
    assert extract_answer("The answer is 17.", fallback_to_last_number=True) == "17"


def test_normalize_answer() -> None:
    assert normalize_answer(" $1,234$ ") == "1234"
    assert normalize_answer("\\$5.") == "5"
    assert normalize_answer("12 apples") == "12"
    assert normalize_answer("3 pi") == "3 pi"  # not a unit


def test_digit_group_separators_are_joined_and_lists_are_not() -> None:
    assert normalize_answer(r"11,\! 111,\! 111,\! 100") == "11111111100"
    assert normalize_answer(r"(1,\!000, 2)") == "(1000, 2)"
    assert normalize_answer("3, 5, 7") == "3, 5, 7"  # a list: no separator command, no join
    assert normalize_answer("1, 000") == "1, 000"  # ambiguous without LaTeX spacing: left to math-verify
    assert normalize_answer(r"1,\!23") == "1,23"  # a group needs exactly three digits


# Every gold answer of MATH500 (500, the `answer` column) and GSM8K test (1319, the `#### N` line), shipped
# with the tests so that a clone can run them.
GOLDS = [json.loads(line) for line in (Path(__file__).parent / "data" / "math_golds.jsonl").open()]


def _raw(gold: str) -> str:
    return gold.removeprefix("####").strip()


@functools.cache
def _plain(raw: str) -> list:
    """Plain math-verify's reading of a raw gold: the reference meaning."""
    return parse(f"${raw}$")


def _integer(raw: str) -> int | None:
    """The gold as an integer when plain math-verify reads it as one (most golds)."""
    parsed = _plain(raw)
    return int(parsed[0]) if parsed and isinstance(parsed[0], sympy.Integer) else None


def test_gold_fixture_holds_both_benchmarks() -> None:
    counts = {name: sum(g["benchmark"] == name for g in GOLDS) for name in ("math500", "gsm8k")}
    assert counts == {"math500": 500, "gsm8k": 1319}
    assert sum(_integer(_raw(g["answer"])) is not None for g in GOLDS) > 1600


def test_no_gold_changes_meaning_under_normalisation() -> None:
    """Plain math-verify on the raw gold is the meaning; normalisation must keep it, both ways."""
    changed = []
    for gold in GOLDS:
        raw, normalized = _raw(gold["answer"]), normalize_answer(reference_answer(gold["answer"]))
        before, after = _plain(raw), parse(f"${normalized}$")
        if not (verify(before, after) and verify(after, before)):
            changed.append((gold["benchmark"], gold["id"], raw, normalized))
    assert changed == []


@pytest.mark.slow
def test_every_gold_passes_and_a_wrong_answer_fails() -> None:
    """The right answer (as a plain integer where it is one) passes; that integer plus one fails."""
    right_failed, wrong_passed = [], []
    for gold in GOLDS:
        raw = _raw(gold["answer"])
        value = _integer(raw)
        right = raw if value is None else str(value)
        if not check_math(f"The answer is $\\boxed{{{right}}}$.", gold["answer"]):
            right_failed.append((gold["benchmark"], gold["id"], right))
        if value is not None and check_math(f"\\boxed{{{value + 1}}}", gold["answer"]):
            wrong_passed.append((gold["benchmark"], gold["id"], value + 1))
    assert right_failed == []
    assert wrong_passed == []


def test_check_math_on_whole_completions() -> None:
    gsm_gold = "Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips.\n#### 72"
    assert check_math("48 + 24 = 72, so the answer is \\boxed{72}.", gsm_gold)
    assert check_math("So she sold 72 clips.\n#### 72", gsm_gold)
    assert not check_math("\\boxed{71}", gsm_gold)
    assert not check_math("She sold 72 clips.", gsm_gold)  # no final-answer marker
    assert check_math("She sold 72 clips.", gsm_gold, fallback_to_last_number=True)
    math_gold = r"Hence $x = \boxed{\frac{2}{3}}$."
    assert check_math(r"... so the answer is $\boxed{\dfrac{2}{3}}$", math_gold)
    assert check_math(r"\boxed{0.6666666667}", math_gold)
    assert not check_math(r"\boxed{\frac{3}{2}}", math_gold)


def test_works_outside_the_main_thread() -> None:
    pairs = [(g, p, e) for g, p, e in ANSWER_PAIRS if p]
    assert threading.current_thread() is threading.main_thread()
    with ThreadPoolExecutor(max_workers=4) as pool:
        verdicts = list(pool.map(lambda pair: math_equal(reference_answer(pair[0]), pair[1]), pairs))
    assert verdicts == [expected for *_, expected in pairs]


def test_bad_input_types() -> None:
    with pytest.raises(TypeError):
        math_equal(1, "1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        check_math(None, "1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        extract_boxed(b"\\boxed{1}")  # type: ignore[arg-type]
