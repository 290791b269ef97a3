"""TRL-style recipe parsing shared by the recipe-driven commands, and the one flag dialect of every command."""

from __future__ import annotations

import argparse
import difflib
import inspect
import re
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

# ``--max-new-tokens`` is read as ``--max_new_tokens``: every command's flags are snake_case, kebab is accepted.
_KEBAB_FLAG = re.compile(r"--[a-z][a-z0-9]*(?:-[a-z0-9]+)+")
_ARG_LINE = re.compile(r"^(\s+)(\w+)(?: \([^)]*\))?: (.*)$")
CONFIG_HELP = "a YAML recipe: its keys are this command's options; flags given too override it"


class RecipeError(ValueError):
    """A recipe or its flags are wrong: the dispatcher prints ``t3d-trl <command>: <message>`` and exits with 2."""


def did_you_mean(name: str, candidates: Sequence[str]) -> str:
    """``"; did you mean X?"`` for the closest of ``candidates`` (difflib), or ``""``."""
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


def named_paths(items: Sequence[str], what: str, bare: bool = True) -> dict[str, str]:
    """``NAME=PATH`` entries as a dict. With ``bare``, an entry that is a path (an existing one, or one whose part
    before the first ``=`` holds a ``/``, as ``runs/lr=1e-4/model`` does) is named after its last component."""
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if bare and (not sep or "/" in name or Path(item).exists()):
            name, value = Path(item.rstrip("/")).name or item, item
        elif not sep:
            raise ValueError(f"{what} entries must read NAME=PATH, got {item!r}")
        if not name or not value:
            raise ValueError(f"{what} entries must read {'PATH or ' if bare else ''}NAME=PATH, got {item!r}")
        if name in pairs:
            raise ValueError(f"{what}: the name {name!r} appears twice; name them with NAME=PATH")
        pairs[name] = value
    return pairs


def _long_flags(parser: argparse.ArgumentParser) -> list[str]:
    return [o for action in parser._actions for o in action.option_strings if o.startswith("--")]


def unknown_flags_message(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """One line naming the first unknown flag (or stray value) and the closest flag the parser knows."""
    flags = [e.partition("=")[0] for e in extras if e.startswith("-")]
    if not flags:
        return f"unexpected value(s) {' '.join(extras)} (each option needs its --flag)"
    return f"unknown flag {flags[0]}{did_you_mean(flags[0], _long_flags(parser))}"


def raise_recipe_error(message: str) -> None:
    """``ArgumentParser.error``: one line through the dispatcher (exit status 2), not argparse's usage + exit."""
    raise RecipeError(message)


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` as every command uses it: no abbreviated flags (``--max_step`` is not ``--max_steps``), and
    errors that name the closest valid flag, raised as :class:`RecipeError` (one line, exit status 2)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise_recipe_error(message)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            raise RecipeError(unknown_flags_message(self, extras))
        return namespace


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

    parser = TrlParser(list(dataclass_types), prog=prog, description=description, allow_abbrev=False)
    parser.error = raise_recipe_error
    parser.set_defaults_with_config = lambda **config: _set_recipe_defaults(parser, config)
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
        elif any(o.startswith("--no_") for o in action.option_strings):
            # transformers copies the positive flag's help; "%(default).0s" keeps argparse from appending this
            # flag's own default, which reads as the opposite.
            action.help = f"set --{action.dest} to false%(default).0s"
        elif not action.help and action.option_strings:
            action.help = helps.get(action.dest)
        if action.type is not None and getattr(action.type, "__name__", "") == "string_to_bool":
            # Every boolean takes a bare --flag: transformers gives optional ones (bf16, tf32) no const.
            action.nargs, action.const = "?", True
    return parser


def _set_recipe_defaults(parser: argparse.ArgumentParser, config: dict[str, Any]) -> list[str]:
    """TrlParser's ``set_defaults_with_config``, reading a key as its flag would be read (aliases, kebab-case).

    Returns the unknown keys as ``["--key", "value", ...]``, as TrlParser does.
    """
    remaining = []
    for key, value in config.items():
        flag = "--" + str(key).replace("-", "_")
        action = next((a for a in parser._actions if flag in a.option_strings or a.dest == key), None)
        if action is None:
            remaining += [f"--{key}", str(value)]
            continue
        action.default, action.required = _as_flag_value(action, str(key), value), False
    return remaining


def _as_flag_value(action: argparse.Action, key: str, value: Any) -> Any:
    """A recipe value read as its flag's value would be (argparse converts only string defaults): typed by the
    flag's type and checked against its choices, so a wrong YAML type is one line naming the key, not a
    traceback later."""
    if value is None or action.type is None and not action.choices:
        return value
    many = action.nargs in ("+", "*") or isinstance(action.nargs, int)
    items = value if many and isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, (dict, list)):
            return value  # structured values (dicts) are the dataclass's to read
        converted = item
        if action.type is not None:
            try:
                converted = action.type(str(item))
            except (ValueError, TypeError, argparse.ArgumentTypeError) as err:
                raise RecipeError(f"recipe key {key}: invalid value {item!r} ({err})") from err
        if action.choices and converted not in action.choices:
            choices = ", ".join(map(str, action.choices))
            hint = (
                "; YAML reads an unquoted no/yes/on/off as a boolean: quote it"
                if isinstance(item, bool)
                else ""
            )
            raise RecipeError(f"recipe key {key}: invalid choice {item!r} (choose from {choices}){hint}")
        out.append(converted)
    return out if many else out[0]  # one YAML value of a list option is a list of one (`methods: td`)


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
    argv = [part for arg in argv for part in (arg.split("=", 1) if arg.startswith("--config=") else [arg])]
    if argv and argv[-1] == "--config":
        raise RecipeError("--config needs a recipe file: --config RECIPE.yaml")
    if argv.count("--config") > 1:
        raise RecipeError("--config is given twice: one recipe per run (flags override its values)")
    flags = list(argv)
    if "--config" in flags:  # TrlParser reads it; the rest are flags
        del flags[flags.index("--config") : flags.index("--config") + 2]
    # An unknown flag first: the dataclasses' own checks (run while parsing) would otherwise speak first.
    try:
        extras = argparse.ArgumentParser.parse_known_args(parser, flags)[1]
    except RecipeError:
        extras = []  # a bad value: reported by the parse below
    if extras:
        raise RecipeError(unknown_flags_message(parser, extras))
    try:
        *parsed, unknown_keys, extras = parser.parse_args_and_config(
            args=argv, return_remaining_strings=True, separate_remaining_strings=True
        )
    except yaml.YAMLError as err:  # its message names the file, line and column
        raise RecipeError(f"the recipe is not valid YAML: {err}") from err
    except (ValueError, OSError) as err:
        raise RecipeError(str(err)) from err
    if unknown_keys:
        key = unknown_keys[0][2:]
        keys = [a.dest for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]
        raise RecipeError(f"unknown key {key!r} in the recipe{did_you_mean(key, keys)}")
    if extras:
        raise RecipeError(unknown_flags_message(parser, extras))
    for config in parsed:
        for name in getattr(type(config), "cli_hidden", ()):
            if getattr(config, name) != next(f.default for f in fields(config) if f.name == name):
                raise RecipeError(f"{name} is no setting of {prog}: it is always set by the command itself")
    return tuple(parsed)
