"""The ``--quick`` flag every benchmark script takes: a seconds-long smoke run of the whole script (the test suite
runs each script so), on tiny defaults that flags given with it override."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

HELP = (
    "a seconds-long smoke run of the whole script (the test suite runs it so): tiny defaults, which flags given "
    "with it override; its figures mean nothing"
)


def parse_with_quick(
    parser: argparse.ArgumentParser,
    tiny: Mapping[str, Any] | Callable[[argparse.Namespace], Mapping[str, Any]],
    help: str = HELP,
    argv: list[str] | None = None,
) -> argparse.Namespace:
    """Add ``--quick`` to ``parser`` and parse ``argv`` (default: the command line); under ``--quick`` parse it
    again over the tiny defaults ``tiny`` (or those ``tiny(args)`` returns, where they depend on other flags), so
    that a flag given with ``--quick`` still wins."""
    parser.add_argument("--quick", action="store_true", help=help)
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**(tiny(args) if callable(tiny) else tiny))
        args = parser.parse_args(argv)
    return args
