"""Total-correlation analyser benchmark: states per second, batched over states against one state at a time.

The demo teacher architecture (tiny bidirectional Qwen3, ~0.96M parameters, randomly initialised) on the
``sort2`` task (one block of 8): every state ``x_t`` needs ``t`` forward passes per draw, and the analyser batches
the draws and states of a block into ``--batch_size`` sequences per pass. Compared side by side in this one
process, interleaved: ``batch_size = samples`` (one state per pass, its draws batched) against the default
(many states per pass). The last line printed is one JSON object.

    python benchmarks/bench_total_correlation.py [--rows 32] [--samples 16] [--reps 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
from smoke import parse_with_quick

from t3d_trl import TotalCorrelationConfig, TrajectoryMetadata, total_correlation
from t3d_trl.demo import build_teacher, get_task


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parse_with_quick(parser, {"rows": 2, "samples": 2, "reps": 1, "threads": 1})
    if min(args.rows, args.samples, args.reps, args.threads) < 1:
        parser.error("--rows, --samples, --reps and --threads must be >= 1")
    torch.set_num_threads(args.threads)

    task = get_task("sort2")
    tokenizer = task.tokenizer()
    model = build_teacher(task).eval()
    rng = random.Random(0)
    rows = [
        {
            "prompt_ids": tokenizer(row["prompt"])["input_ids"],
            "completion_ids": tokenizer(row["answer"])["input_ids"],
            "decode_step": rng.sample(range(1, 9), 8),
        }
        for row in task.sample(args.rows, seed=0)
    ]
    metadata = TrajectoryMetadata(
        "bench", 3, "bidirectional", block_length=8, steps_per_block=8, max_new_tokens=8
    )
    settings = {"one_state_per_pass": args.samples, "batched": 4096}
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(args.reps):
        for name, batch_size in settings.items():
            config = TotalCorrelationConfig(num_samples=args.samples, max_states=None, batch_size=batch_size)
            start = time.perf_counter()
            total_correlation(model, rows, metadata, config, progress=False)
            seconds[name].append(time.perf_counter() - start)
    states = args.rows * 8
    best = {name: min(values) for name, values in seconds.items()}
    for name, value in best.items():
        print(f"{name:>20}: {value:6.2f} s  {states / value:8.1f} states/s  (batch_size={settings[name]})")
    speedup = best["one_state_per_pass"] / best["batched"]
    print(f"batched / one state per pass speed-up: {speedup:.2f}x")
    print(
        json.dumps(
            {
                "states": states,
                "samples": args.samples,
                "threads": args.threads,
                "seconds": best,
                "states_per_second": {name: states / value for name, value in best.items()},
                "batched_speedup": speedup,
            }
        )
    )


if __name__ == "__main__":
    main()
