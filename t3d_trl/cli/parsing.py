"""TRL-style recipe parsing shared by the recipe-driven commands."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trl import TrlParser


def parse_recipe(
    dataclass_types: Sequence[type], argv: Sequence[str], prog: str, description: str
) -> tuple[Any, ...]:
    """Parse ``--config recipe.yaml`` plus flags into instances of ``dataclass_types``.

    YAML values become defaults, flags override them, and a key that no dataclass knows raises
    ``ValueError`` naming it (each command prints it and exits with status 2).
    """
    parser = TrlParser(list(dataclass_types), prog=prog, description=description)
    return parser.parse_args_and_config(args=list(argv))
