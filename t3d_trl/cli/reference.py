"""The generated part of ``docs/cli.md``: the decoding options, from ``DiffusionGenerationConfig`` itself.

    python -m t3d_trl.cli.reference docs/cli.md     # rewrite the generated block after changing a field

``tests/test_cli_decoding.py`` checks that the page holds exactly what this module generates and that every
option of the ``generate``, ``collect`` and ``eval`` parsers is named on it, so the page cannot go stale.
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path
from typing import Literal

from ..generation.configuration import DiffusionGenerationConfig
from .decoding import decoding_fields, flag_type
from .parsing import docstring_help

BEGIN = "<!-- BEGIN GENERATED: decoding options (python -m t3d_trl.cli.reference docs/cli.md) -->"
END = "<!-- END GENERATED: decoding options -->"


def _values(name: str) -> str:
    kind = flag_type(name)
    if typing.get_origin(kind) is Literal:
        return ", ".join(f"`{v}`" for v in typing.get_args(kind))
    if kind is bool:
        return "`true`, `false`"
    if typing.get_origin(kind) is list:
        return "one or more ints"
    return kind.__name__


def decoding_table() -> str:
    """A markdown table of the decoding options: flag (= recipe key), values, class default, meaning."""
    helps = docstring_help(DiffusionGenerationConfig)
    rows = ["| option | values | class default | meaning |", "| --- | --- | --- | --- |"]
    for f in decoding_fields():
        default = f.default
        meaning = helps.get(f.name, "").replace("%%", "%").replace("|", "\\|")
        rows.append(f"| `--{f.name}` | {_values(f.name)} | `{default}` | {meaning} |")
    return "\n".join(rows)


def generated_block() -> str:
    return f"{BEGIN}\n{decoding_table()}\n{END}"


def update(path: str | Path) -> bool:
    """Rewrite the generated block of ``path``; returns whether it changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    new = text[:start] + generated_block() + text[end:]
    path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    for doc in sys.argv[1:] or ["docs/cli.md"]:
        print(f"{doc}: {'updated' if update(doc) else 'up to date'}")
