"""The ``t3d-trl`` console script: ``t3d-trl <command> [options]``.

Each command lives in its own module of this package and exposes ``main(argv) -> int``; its one-line help
is registered in :data:`COMMANDS`. Commands that read recipes parse them TRL-style (``--config recipe.yaml``: YAML values become
defaults, command-line flags override them, unknown keys fail); see :func:`t3d_trl.cli.parsing.parse_recipe`.
Expected errors, the ``ValueError`` (bad input or settings, :class:`~t3d_trl.cli.parsing.RecipeError` included) and
``FileNotFoundError`` (a missing file, folder or model), ``FileExistsError`` (an output in the way) or
``ConnectionError`` (the Hub cannot be reached) a command raises, are printed here as one line,
``t3d-trl <command>: <message>``, with exit status 2; ``--debug`` (anywhere on the command line) or
``T3D_TRL_DEBUG=1`` prints their traceback too. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from .parsing import RecipeError, snake_case_flags

#: Errors a command raises on bad input: reported in one line, exit status 2 (see the module docstring).
# Bad input: a value, a missing or misplaced path (an output folder that is a file), an unreachable Hub.
EXPECTED_ERRORS = (
    RecipeError,
    ValueError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    ConnectionError,
)
DEBUG_ENV = "T3D_TRL_DEBUG"

# command name -> (module under t3d_trl.cli, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": (
        "quickstart",
        "the T3D demo end to end on the CPU: teacher, trajectories, distillation, evaluation",
    ),
    "env": ("env", "print versions of t3d-trl, Python, torch and the Hugging Face libraries"),
    "collect": ("collect", "decode a dataset with a teacher and save its trajectories (resumable)"),
    "train": ("train", "distil a few-step student with T3D or a baseline (--config recipe.yaml)"),
    "eval": (
        "eval",
        "evaluate models side by side over benchmarks and decoding budgets (--config recipe.yaml)",
    ),
    "generate": ("generate", "decode one prompt with a diffusion LM, decoding settings as flags"),
    "playground": ("playground", "watch models decode side by side, step by step, in a browser (Gradio)"),
    "analyze": ("analyze", "factorization error (conditional total correlation) of models, with a heatmap"),
    "convert": ("convert", "convert a published LLaDA, SDAR or Dream checkpoint to native transformers"),
    "lm-eval": ("lm_eval", "lm-evaluation-harness with the diffusion model `t3d` (lm_eval's arguments)"),
}


def _usage() -> str:
    lines = ["usage: t3d-trl <command> [options]", "", "commands:"]
    for name, (_, help_line) in COMMANDS.items():
        lines.append(f"  {name:<12} {help_line}")
    lines += [
        "",
        "Run `t3d-trl <command> --help` for the options of a command. Errors on bad input print one line;",
        f"--debug (or {DEBUG_ENV}=1) prints their traceback too; t3d-trl --version prints the version.",
    ]
    return "\n".join(lines)


def _one_line(err: BaseException) -> str:
    # Some messages span lines (YAML, pyarrow): the report is one line.
    return " ".join(str(err).split()) or type(err).__name__


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "").lower() in ("1", "true", "yes")
    argv = [arg for arg in argv if arg != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        from .. import __version__

        print(f"t3d-trl {__version__}")
        return 0
    command, rest = argv[0], snake_case_flags(argv[1:])
    if command not in COMMANDS:
        print(f"t3d-trl: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"t3d_trl.cli.{COMMANDS[command][0]}")
    try:
        return int(module.main(rest) or 0)
    except EXPECTED_ERRORS as err:
        if debug:
            traceback.print_exc()
        print(f"t3d-trl {command}: {_one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
