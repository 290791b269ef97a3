"""The decoding flags of every command, built from :class:`~t3d_trl.DiffusionGenerationConfig`'s fields.

One definition: a field added to the dataclass (with its ``Args:`` docstring entry, and a ``Literal`` type where
it has choices) becomes a flag of ``generate``, ``eval``, ``collect`` and ``lm-eval``'s ``--model_args`` under
its own name, with its choices and help, and a recipe key of the recipe commands. Only the output controls
(:data:`~t3d_trl.generation.configuration.OUTPUT_FIELDS`) are left out: the calling code sets them.

This module stays light (no torch, transformers or TRL), so that ``t3d-trl generate --help`` starts fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal, Union

from ..generation.configuration import OUTPUT_FIELDS, DiffusionGenerationConfig
from .parsing import docstring_help

#: Left-out decoding flags keep the model's saved setting.
UNSET_HELP = "unset: the model's saved setting"


def decoding_fields() -> list[dataclasses.Field]:
    """The fields of :class:`DiffusionGenerationConfig` a user sets: every one but the output controls."""
    return [f for f in dataclasses.fields(DiffusionGenerationConfig) if f.name not in OUTPUT_FIELDS]


def _resolved_types() -> dict[str, Any]:
    return typing.get_type_hints(DiffusionGenerationConfig)


def _without_none(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return (annotation,)


def flag_type(name: str) -> Any:
    """The command-line type of a decoding field: ``Literal``, ``bool``, ``int``, ``float`` or ``list[int]``.

    ``eos_token_id`` (``int | list[int] | None``) reads one or several ids, as ``list[int]``.
    """
    options = _without_none(_resolved_types()[name])
    if len(options) == 1:
        return options[0]
    if all(o is int or typing.get_origin(o) is list for o in options):
        return list[int]
    raise TypeError(f"DiffusionGenerationConfig.{name}: no command-line type for {options}")


def str_to_bool(value: str | bool) -> bool:
    """``true``/``false`` (and yes/no, 1/0) as a bool, for ``--stop_at_eos false``."""
    if isinstance(value, bool):
        return value
    if value.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if value.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _or_none(kind: type) -> Any:
    """``kind`` as an argparse type that also reads ``none`` (as ``None``)."""

    def parse(value: str) -> Any:
        return None if value.lower() == "none" else kind(value)

    parse.__name__ = kind.__name__  # argparse names the type in its errors: "invalid float value"
    return parse


def add_decoding_arguments(parser: argparse.ArgumentParser | Any) -> None:
    """Add a flag per decoding field (left out: not set, so the model's saved setting decides)."""
    helps = docstring_help(DiffusionGenerationConfig)
    for f in decoding_fields():
        kind = flag_type(f.name)
        kwargs: dict[str, Any] = {"default": argparse.SUPPRESS, "help": helps.get(f.name)}
        if typing.get_origin(kind) is Literal:
            kwargs["choices"] = typing.get_args(kind)
        elif kind is bool:
            kwargs.update(type=str_to_bool, nargs="?", const=True, metavar="{true,false}")
        elif typing.get_origin(kind) is list:
            kwargs.update(type=typing.get_args(kind)[0], nargs="+")
        elif f.default is None:  # `none` clears the model's saved value (a saved threshold: static decoding)
            kwargs.update(
                type=_or_none(kind), help=f"{kwargs['help']} ('none' clears the model's saved value)"
            )
        else:
            kwargs["type"] = kind
        parser.add_argument(f"--{f.name}", **kwargs)
        if kind is bool and f.default is True:  # as TrlParser spells it in the recipe commands
            parser.add_argument(
                f"--no_{f.name}",
                dest=f.name,
                action="store_false",
                default=argparse.SUPPRESS,
                help=f"--{f.name} false",
            )


def decoding_overrides(namespace: argparse.Namespace) -> dict[str, Any]:
    """The decoding fields a parsed command line set (for :meth:`DiffusionGenerationConfig.update`)."""
    return {f.name: getattr(namespace, f.name) for f in decoding_fields() if hasattr(namespace, f.name)}


def optional_decoding_fields(skip: Iterable[str] = ()) -> list[tuple[str, Any, dataclasses.Field]]:
    """Every decoding field as an optional recipe setting (default ``None``: the model's saved setting).

    For :func:`dataclasses.make_dataclass`: the recipe commands' dataclasses (``eval``) get the same fields,
    types (``Optional``, as ``TrlParser`` reads them) and docstring help as ``DiffusionGenerationConfig``.
    """
    helps = docstring_help(DiffusionGenerationConfig)
    out = []
    for f in decoding_fields():
        if f.name in skip:
            continue
        kind = flag_type(f.name)
        text = helps.get(f.name, "")
        out.append(
            (
                f.name,
                kind | None,
                dataclasses.field(default=None, metadata={"help": f"{text} ({UNSET_HELP})"}),
            )
        )
    return out
