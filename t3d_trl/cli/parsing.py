"""TRL-style recipe parsing shared by the recipe-driven commands."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class RecipeError(ValueError):
    """A recipe or its flags are wrong: the dispatcher prints ``t3d-trl <command>: <message>`` and exits with 2."""


def parse_recipe(
    dataclass_types: Sequence[type], argv: Sequence[str], prog: str, description: str
) -> tuple[Any, ...]:
    """Parse ``--config recipe.yaml`` plus flags into instances of ``dataclass_types``.

    YAML values become defaults, flags override them, and a key that no dataclass knows, a value a dataclass
    refuses or a recipe file that cannot be read raises :class:`RecipeError` naming it.
    """
    from trl import TrlParser  # here, so that the dispatcher importing RecipeError stays light

    parser = TrlParser(list(dataclass_types), prog=prog, description=description)
    try:
        return parser.parse_args_and_config(args=list(argv))
    except (ValueError, OSError) as err:
        raise RecipeError(str(err)) from err
