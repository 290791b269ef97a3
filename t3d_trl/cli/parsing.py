"""TRL-style recipe parsing shared by the recipe-driven commands, and the one flag dialect of every command."""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

# ``--max-new-tokens`` is read as ``--max_new_tokens``: every command's flags are snake_case, kebab is accepted.
_KEBAB_FLAG = re.compile(r"--[a-z][a-z0-9]*(?:-[a-z0-9]+)+")
_ARG_LINE = re.compile(r"^(\s+)(\w+)(?: \([^)]*\))?: (.*)$")
CONFIG_HELP = "a YAML recipe: its keys are this command's options; flags given too override it"


class RecipeError(ValueError):
    """A recipe or its flags are wrong: the dispatcher prints ``t3d-trl <command>: <message>`` and exits with 2."""


def snake_case_flags(argv: Sequence[str]) -> list[str]:
    """``--max-new-tokens 8`` -> ``--max_new_tokens 8`` (and ``--no-use-cache`` -> ``--no_use_cache``)."""
    out = []
    for arg in argv:
        flag, sep, value = arg.partition("=")
        if _KEBAB_FLAG.fullmatch(flag):
            arg = "--" + flag[2:].replace("-", "_") + sep + value
        out.append(arg)
    return out


def docstring_help(cls: type) -> dict[str, str]:
    """Field -> its entry in the Google-style ``Args:`` sections of ``cls`` and its bases (``cls`` wins)."""
    helps: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        name, indent, text = None, 0, []
        in_args = False
        for line in [*inspect.cleandoc(klass.__dict__.get("__doc__") or "").splitlines(), ""]:
            match = _ARG_LINE.match(line)
            if name and (not line.startswith(" " * (indent + 1)) or match and len(match.group(1)) == indent):
                helps[name] = " ".join(text).replace("``", "").replace("%", "%%")  # argparse formats help
                name = None
            if line.strip() == "Args:":
                in_args, indent = True, 0
            elif in_args and match and (not indent or len(match.group(1)) == indent):
                name, indent, text = match.group(2), len(match.group(1)), [match.group(3).strip()]
            elif in_args and name:
                text.append(line.strip())
            elif in_args and not line.startswith(" "):
                in_args = False
    return helps


def build_recipe_parser(
    dataclass_types: Sequence[type], prog: str | None = None, description: str | None = None
):
    """The ``TrlParser`` of a recipe command: ``--config`` listed, every option with a help text.

    Options without a ``help`` in their field's metadata take it from the dataclass docstring; fields a
    dataclass lists in ``cli_hidden`` (settings that mean nothing on the command line) are no options and no
    recipe keys.
    """
    from trl import TrlParser  # here, so that the dispatcher importing RecipeError stays light

    parser = TrlParser(list(dataclass_types), prog=prog, description=description)
    # TrlParser reads --config itself; declared here only so that --help lists it.
    parser.add_argument("--config", metavar="RECIPE.yaml", default=argparse.SUPPRESS, help=CONFIG_HELP)
    helps: dict[str, str] = {}
    hidden: set[str] = set()
    for cls in dataclass_types:
        helps.update({k: v for k, v in docstring_help(cls).items() if k not in helps})
        hidden.update(getattr(cls, "cli_hidden", ()))
    for action in parser._actions:
        if (
            action.dest in hidden
        ):  # kept for the parser's bookkeeping, left out of --help, refused in parse_recipe
            action.help = argparse.SUPPRESS
        elif not action.help and action.option_strings:
            negated = any(o.startswith("--no_") for o in action.option_strings)
            action.help = f"set --{action.dest} to false" if negated else helps.get(action.dest)
    return parser


def parse_recipe(
    dataclass_types: Sequence[type], argv: Sequence[str], prog: str, description: str
) -> tuple[Any, ...]:
    """Parse ``--config recipe.yaml`` plus flags into instances of ``dataclass_types``.

    YAML values become defaults, flags override them, and a key that no dataclass knows, a value a dataclass
    refuses or a recipe file that cannot be read raises :class:`RecipeError` naming it. The parser is
    :func:`build_recipe_parser`'s.
    """
    import yaml

    parser = build_recipe_parser(dataclass_types, prog, description)
    argv = list(argv)
    if argv and argv[-1] == "--config":
        raise RecipeError("--config needs a recipe file: --config RECIPE.yaml")
    try:
        parsed = parser.parse_args_and_config(args=argv)
    except yaml.YAMLError as err:  # its message names the file, line and column
        raise RecipeError(f"the recipe is not valid YAML: {err}") from err
    except (ValueError, OSError) as err:
        raise RecipeError(str(err)) from err
    for config in parsed:
        for name in getattr(type(config), "cli_hidden", ()):
            if getattr(config, name) != next(f.default for f in fields(config) if f.name == name):
                raise RecipeError(f"{name} is no setting of {prog}: it is always set by the command itself")
    return parsed
