"""Start-up time of the command line against ``python -c "import torch, transformers"``, in one run.

Four commands, each in a fresh process, interleaved round by round so that the machine's load affects them alike:

* ``import``: ``python -c "import torch, transformers"`` (the floor of anything that runs a model);
* ``help``: ``t3d-trl generate --help`` (must not load torch at all);
* ``generate``: a one-prompt ``t3d-trl generate`` on the packaged wordsort teacher (loads torch, transformers
  and the model, decodes 16 tokens);
* ``floor``: ``python -c "import torch, transformers.modeling_utils"``, what any ``from_pretrained`` imports
  (transformers' model-loading code pulls in ``torch.distributed.tensor``, ``torch._dynamo``, sympy and scipy):
  the part of ``generate`` that no command of ours can avoid, reported as ``floor_over_import``.

The median wall time of each over ``--rounds`` rounds, and the ratios ``help_over_import`` and
``generate_over_import`` (targets: at most 1.3 and 2.0, docs/benchmarks.md) in the last-line JSON.

    python benchmarks/bench_startup.py [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from smoke import parse_with_quick

REPO = Path(__file__).resolve().parents[1]
TEACHER = REPO / "t3d_trl" / "demo" / "teachers" / "wordsort"
PROMPT = "jade bear mint gust note kelp sand hint"  # a wordsort prompt: words its tokenizer knows


def _cli() -> list[str]:
    """The ``t3d-trl`` console script next to this Python, else ``python -m t3d_trl.cli.main``."""
    script = Path(sys.executable).with_name("t3d-trl")
    if script.is_file():
        return [str(script)]
    found = shutil.which("t3d-trl")
    return [found] if found else [sys.executable, "-m", "t3d_trl.cli.main"]


def commands() -> dict[str, list[str]]:
    cli = _cli()
    return {
        "import": [sys.executable, "-c", "import torch, transformers"],
        "floor": [sys.executable, "-c", "import torch, transformers.modeling_utils"],
        "help": [*cli, "generate", "--help"],
        "generate": [
            *cli,
            "generate",
            *("--model", str(TEACHER), "--prompt", PROMPT, "--no_use_chat_template"),
            *("--max_new_tokens", "16", "--device", "cpu"),
        ],
    }


def _time(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the commands (median taken)")
    args = parse_with_quick(
        parser, {"rounds": 1}, help="default to one round (a smoke test, not a figure); --rounds wins"
    )
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    rounds = args.rounds
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    cmds = commands()
    for command in cmds.values():  # warm the file cache once, so the first round is not the odd one out
        _time(command, env)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(rounds):
        for name, command in cmds.items():
            times[name].append(_time(command, env))
    median = {name: statistics.median(values) for name, values in times.items()}
    for name, command in cmds.items():
        print(
            f"{name:>8}: {median[name]:.3f} s (median of {rounds})  {' '.join(Path(c).name for c in command[:3])}"
        )
    result = {
        "rounds": rounds,
        "seconds": {name: round(value, 4) for name, value in median.items()},
        "help_over_import": round(median["help"] / median["import"], 3),
        "generate_over_import": round(median["generate"] / median["import"], 3),
        "floor_over_import": round(median["floor"] / median["import"], 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
