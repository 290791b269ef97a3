"""``t3d-trl analyze``: the factorization error (conditional total correlation) of models, side by side.

    t3d-trl analyze --model teacher=PATH --model t3d=PATH --trajectories TRAJ_DIR --output_dir analysis
    t3d-trl analyze --model teacher=PATH --model t3d=PATH --task sort2 --num_prompts 64

Every model is measured on the same teacher trajectory states: those of a trajectory dataset
(``--trajectories``, as written by ``t3d-trl collect``), or those of the FIRST model decoding prompts of an
embedded demo task one token per step (``--task``). Writes ``total_correlation.json`` (per model: TC over the
decoding intervals with standard errors, TC by jump size, entropy against mask ratio), ``tc_heatmap.png``,
``tc_by_jump.png`` and ``entropy.png`` into ``--output_dir``, and prints TC by jump size. See docs/analysis.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from .parsing import ArgumentParser, named_paths


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="t3d-trl analyze", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="[NAME=]PATH",
        help="checkpoint folder or Hub repo id, optionally named (repeat to compare models; with --task the "
        "first one decodes the states)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trajectories", metavar="PATH", help="trajectory dataset (folder or Hub repo id)")
    source.add_argument(
        "--task",
        # Not imported here to list them: the demo tasks load transformers, and --help stays fast without it.
        help="embedded demo task whose prompts the first model decodes (a name of t3d_trl.demo.DEMO_TASKS, "
        "e.g. sort2; an unknown name is refused with the list)",
    )
    parser.add_argument(
        "--num_prompts",
        type=int,
        default=64,
        help="with --task: prompts to decode (default 64)",
    )
    parser.add_argument(
        "--block_length",
        type=int,
        default=None,
        help="with --task: decoding block length (default: the task's); with --trajectories it must match theirs",
    )
    parser.add_argument("--samples", type=int, default=32, help="draws from the joint per state (default 32)")
    parser.add_argument(
        "--max_states",
        type=int,
        default=512,
        help="states analysed per model, whole blocks at a time (default 512)",
    )
    parser.add_argument(
        "--batch_size", type=int, default=256, help="sequences per forward pass (default 256)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the task prompts, block choice and draws"
    )
    parser.add_argument(
        "--output_dir", default="analysis", help="where the JSON and figures go (default: analysis)"
    )
    parser.add_argument(
        "--dtype", default="auto", help="auto (the checkpoint's), bfloat16, float16 or float32"
    )
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Bad values are ValueErrors: the dispatcher prints them as one line (exit 2), like every other command.
    for name in ("num_prompts", "samples", "max_states", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be positive, got {getattr(args, name)}")
    from ..demo import get_task

    models = named_paths(args.model, "--model")
    task = get_task(args.task) if args.task else None

    from ..analysis import TotalCorrelationConfig, total_correlation
    from ..analysis.plots import plot_entropy, plot_tc_by_jump, plot_tc_heatmap
    from ..analysis.total_correlation import check_model_matches
    from ..data.schema import TrajectoryMetadata
    from ..evaluation.runner import load_model

    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config = TotalCorrelationConfig(
        num_samples=args.samples, max_states=args.max_states, batch_size=args.batch_size, seed=args.seed
    )
    loaded = {name: load_model(path, args.dtype, args.device) for name, path in models.items()}
    if task is not None:
        for name, (_, tokenizer) in loaded.items():
            unknown = [
                w for w in task.words if tokenizer.convert_tokens_to_ids(w) in (None, tokenizer.unk_token_id)
            ]
            if unknown:  # a model of another task would read the prompts as unknown tokens, and still measure
                raise ValueError(
                    f"model {name!r}: its tokenizer does not know the {task.name} task's tokens {unknown[:5]}: "
                    "is it a model of another task?"
                )
    with tempfile.TemporaryDirectory() as scratch:
        trajectories = _trajectories(args, task, loaded, scratch)
        metadata = TrajectoryMetadata.from_dataset(trajectories)
        if args.trajectories and args.block_length not in (None, metadata.block_length):
            raise ValueError(
                f"--block_length {args.block_length} differs from the trajectories' block_length "
                f"{metadata.block_length} (their decoding order is defined per block)"
            )
        for name, (model, _) in loaded.items():  # every model, before the first (long) estimate
            try:
                check_model_matches(model, metadata)
            except ValueError as err:
                raise ValueError(f"model {name!r}: {err}") from err
        results = {}
        for name, (model, _) in loaded.items():
            print(f"{name}: estimating TC on {len(trajectories)} trajectories")
            results[name] = total_correlation(model, trajectories, metadata, config)

    report = {
        "settings": {
            "models": models,
            "trajectories": args.trajectories,
            "task": args.task,
            "num_prompts": args.num_prompts if args.task else None,
            "trajectory_metadata": metadata.to_dict(),
            "samples": args.samples,
            "max_states": args.max_states,
            "seed": args.seed,
        },
        "models": {name: result.to_dict() for name, result in results.items()},
    }
    (output_dir / "total_correlation.json").write_text(json.dumps(report, indent=2))
    figures = [
        plot_tc_heatmap(results, output_dir / "tc_heatmap.png"),
        plot_tc_by_jump(results, output_dir / "tc_by_jump.png"),
        plot_entropy(results, output_dir / "entropy.png"),
    ]
    print(_table(results))
    print(f"wrote {output_dir / 'total_correlation.json'}, " + ", ".join(str(f) for f in figures))
    return 0


def _trajectories(args: argparse.Namespace, task: Any, loaded: dict, scratch: str) -> Any:
    """The trajectory dataset: loaded, or decoded by the first model on demo task prompts."""
    if task is None:
        from ..data.hub import load_trajectories

        return load_trajectories(args.trajectories)
    from ..data.trajectories import collect_trajectories

    model, tokenizer = next(iter(loaded.values()))
    block_length = args.block_length or task.block_length
    if task.answer_length % block_length:
        raise ValueError(
            f"--block_length {block_length} does not divide the answer length {task.answer_length}"
        )
    return collect_trajectories(
        model,
        tokenizer,
        task.sample(args.num_prompts, args.seed),
        "plain",
        output_dir=Path(scratch) / "trajectories",
        generation_config=task.generation_config(block_length=block_length),
        batch_size=64,
        prompt_column="prompt",
        use_chat_template=False,
        seed=args.seed,
    )


def _table(results: dict) -> str:
    jumps = sorted({entry["jump"] for result in results.values() for entry in result.by_jump})
    width = max(18, *(len(name) + 2 for name in results))
    lines = [
        "TC (nats, ± standard error) by jump size",
        "jump  " + "".join(f"{name:>{width}}" for name in results),
    ]
    for jump in jumps:
        cells = []
        for result in results.values():
            entry = next((e for e in result.by_jump if e["jump"] == jump), None)
            if entry is None:
                cells.append(f"{'-':>{width}}")
            else:
                stderr = entry["stderr"]
                text = f"{entry['tc']:.3f} ± {stderr:.3f}" if stderr == stderr else f"{entry['tc']:.3f}"
                cells.append(f"{text:>{width}}")
        lines.append(f"{jump:>4}  " + "".join(cells))
    return "\n".join(lines)
