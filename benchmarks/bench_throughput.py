"""Decoding throughput (tokens/s) of randomly initialised 1.7B-shaped models on an accelerator.

Two Qwen3-1.7B-shaped models (hidden 2048, 28 layers, 16 heads / 8 KV heads, vocabulary 151,936, bf16):
an LLaDA-like bidirectional one and an SDAR-like block-causal one (blocks of 4). Each decodes
``--gen-len`` tokens after a ``--prompt-len`` prompt at every batch size of ``--batch-sizes``:

* bidirectional, blocks of ``--block`` (32), one token per step: ``exact`` (no cache), ``prefix`` and ``dual``
  (the approximate Fast-dLLM caches), ``dynamic`` (threshold 0.9, no cache) and ``dynamic+dual``;
* block-causal, blocks of 4, one token per step: ``exact`` (the exact block KV cache), ``no_cache`` (the
  whole canvas up to the block every step) and ``dynamic`` (threshold 0.9, block KV cache).

Tokens/s counts generated tokens of all rows over the wall time of one ``diffusion_generate`` call (the best
of ``--reps``), synchronised with the device; ``over_exact`` is a row's tokens/s over its model's ``exact`` row at
the same batch (the ratio the caches buy). The weights are random, so a threshold rule commits about one
token per step: the ``nfe`` column says how many forward passes a configuration took, and the dynamic rows
show the per-step cost, not the step savings of a trained model. Every configuration's row is printed (and
appended to ``--output``) as soon as it is measured; the last line printed is one JSON object.

With ``--compile`` every configuration is also decoded with ``compile="reduce-overhead"`` (CUDA graphs; ``default``
on the CPU), at batch 1, 16, 64 and 128 by default: its tokens/s, its speed-up over eager, its compile time, and
whether its tokens equal eager's. On CUDA every row reports the peak GPU memory of its decoding.

    python benchmarks/bench_throughput.py [--device cuda] [--reps 2] [--output rows.jsonl] [--compile] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch
from smoke import parse_with_quick
from transformers import Qwen3Config, Qwen3ForCausalLM

from t3d_trl import DiffusionConfig, add_diffusion_generation
from t3d_trl.generation.compiled import step_for
from t3d_trl.generation.memory import peak_memory_gb, reset_peak_memory

QWEN3_1_7B = dict(
    vocab_size=151_936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
)
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=True,
)


def build_model(attention: str, shape: dict, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """A randomly initialised Qwen3 of ``shape`` on ``device``, with diffusion generation added."""
    torch.manual_seed(0)
    config = Qwen3Config(**shape, max_position_embeddings=4096, eos_token_id=None)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype).eval()
    diffusion = DiffusionConfig(
        mask_token_id=shape["vocab_size"] - 1,
        attention=attention,
        block_size=4 if attention == "block_causal" else None,
    )
    return add_diffusion_generation(model, diffusion)


CONFIGS: dict[str, dict[str, dict]] = {
    "bidirectional": {
        "exact": dict(cache="none"),
        "prefix": dict(cache="prefix"),
        "dual": dict(cache="dual"),
        "dynamic": dict(cache="none", threshold=0.9),
        "dynamic+dual": dict(cache="dual", threshold=0.9),
    },
    "block_causal": {
        "exact": dict(use_cache=True),
        "no_cache": dict(use_cache=False),
        "dynamic": dict(use_cache=True, threshold=0.9),
    },
}


def timed(device: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    """Wall time of ``fn(*args, **kwargs)``, synchronised with the device, and its result."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def compiled_row(
    args: argparse.Namespace,
    model: torch.nn.Module,
    prompt: torch.Tensor,
    settings: dict,
    mode: str,
    eager_wall: float,
    eager_out: Any,
) -> dict[str, Any]:
    """The compiled columns of a row: one untimed generation compiles (and captures graphs), then the best of
    ``--reps`` timed ones, their peak memory, and whether their tokens equal the eager ones."""
    step = step_for(model, mode)
    before = step.compile_seconds
    model.diffusion_generate(prompt, **settings, compile=mode)
    compile_s = step.compile_seconds - before
    reset_peak_memory(torch.device(args.device))
    walls, out = [], None
    for _ in range(args.reps):
        wall, out = timed(args.device, model.diffusion_generate, prompt, **settings, compile=mode)
        walls.append(wall)
    wall = min(walls)
    peak = peak_memory_gb(torch.device(args.device))
    return {
        "compiled_wall_s": round(wall, 3),
        "compiled_tokens_per_s": round(prompt.shape[0] * args.gen_len / wall, 1),
        "compiled_speedup": round(eager_wall / wall, 2),
        "compile_s": round(compile_s, 1),
        "compiled_peak_memory_gb": None if peak is None else round(peak, 2),
        "compiled_identical_tokens": bool(torch.equal(out.sequences, eager_out.sequences)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=None, help="default 1 16 (--compile: 1 16 64 128)"
    )
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--gen-len", type=int, default=256)
    parser.add_argument(
        "--block",
        type=int,
        default=32,
        help="bidirectional decoding block (a multiple of 4 dividing --gen-len)",
    )
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--output", default=None, help="append every row to this JSON-lines file")
    parser.add_argument(
        "--compile", action="store_true", help="also decode compiled (reduce-overhead on CUDA) and compare"
    )
    args = parse_with_quick(
        parser,
        # compiling takes tens of seconds per shape: one batch size (and one configuration, below)
        lambda args: {
            "batch_sizes": [2] if args.compile else [1, 2],
            "prompt_len": 16,
            "gen_len": 16,
            "block": 8,
            "reps": 1,
        },
        help="tiny model, short decode (seconds, any device): tiny defaults, which flags given with it override",
    )
    shape = TINY if args.quick else QWEN3_1_7B
    if args.batch_sizes is None:
        args.batch_sizes = [1, 16, 64, 128] if args.compile else [1, 16]
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device here")
    if min(args.reps, args.prompt_len, *args.batch_sizes) < 1:
        parser.error("--reps, --prompt-len and --batch-sizes must be >= 1")
    if args.block < 4 or args.block % 4 or args.gen_len % args.block:
        parser.error(f"--block {args.block} must be a multiple of 4 that divides --gen-len ({args.gen_len})")
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    mode = "reduce-overhead" if args.device.startswith("cuda") else "default"
    configs = CONFIGS
    if args.quick and args.compile:
        configs = {"block_causal": {"exact": CONFIGS["block_causal"]["exact"]}}
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    print(
        f"device: {device_name}; dtype {dtype}; prompt {args.prompt_len}, generate {args.gen_len}", flush=True
    )

    rows = []
    for attention, modes in configs.items():
        model = build_model(attention, shape, args.device, dtype)
        block = 4 if attention == "block_causal" else args.block
        params = sum(p.numel() for p in model.parameters())
        for batch in args.batch_sizes:
            prompt = torch.randint(
                0,
                shape["vocab_size"] - 1,
                (batch, args.prompt_len),
                generator=torch.Generator().manual_seed(1),
            ).to(args.device)
            base = dict(
                max_new_tokens=args.gen_len,
                block_length=block,
                tokens_per_step=1,
                stop_at_eos=False,
                return_dict_in_generate=True,
            )
            for name, extra in modes.items():
                # Warm-up on one block (kernels, allocator), then the timed repetitions.
                model.diffusion_generate(prompt, **{**base, **extra, "max_new_tokens": block})
                reset_peak_memory(torch.device(args.device))
                walls, out = [], None
                for _ in range(args.reps):
                    wall, out = timed(args.device, model.diffusion_generate, prompt, **base, **extra)
                    walls.append(wall)
                wall = min(walls)
                peak = peak_memory_gb(torch.device(args.device))
                tokens_per_s = round(batch * args.gen_len / wall, 1)
                if name == "exact":  # the first of every model's modes: what the others are compared with
                    exact_tokens_per_s = tokens_per_s
                row = {
                    "model": "llada_like" if attention == "bidirectional" else "sdar_like",
                    "params": params,
                    "batch": batch,
                    "decoding": name,
                    "block": block,
                    "wall_s": round(wall, 3),
                    "tokens_per_s": tokens_per_s,
                    "over_exact": round(tokens_per_s / exact_tokens_per_s, 2),
                    "nfe": int(out.nfe.max()),
                    "peak_memory_gb": None if peak is None else round(peak, 2),
                }
                if args.compile:
                    row.update(compiled_row(args, model, prompt, {**base, **extra}, mode, wall, out))
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.output:
                    with open(args.output, "a") as handle:
                        handle.write(json.dumps(row) + "\n")
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()

    print()
    header = (
        f"{'model':<12}{'batch':>6}{'decoding':>14}{'tokens/s':>12}{'x exact':>9}{'nfe':>6}{'peak GiB':>10}"
    )
    if args.compile:
        header += f"{'compiled tok/s':>16}{'speed-up':>10}{'compile s':>11}{'identical':>10}"
    print(header)
    for row in rows:
        line = (
            f"{row['model']:<12}{row['batch']:>6}{row['decoding']:>14}{row['tokens_per_s']:>12}"
            f"{row['over_exact']:>9}{row['nfe']:>6}"
            f"{str(row['peak_memory_gb']):>10}"
        )
        if args.compile:
            line += (
                f"{row['compiled_tokens_per_s']:>16}{row['compiled_speedup']:>10}{row['compile_s']:>11}"
                f"{str(row['compiled_identical_tokens']):>10}"
            )
        print(line)
    summary = {
        "device": device_name,
        "dtype": str(dtype),
        "over_exact": {
            f"{row['model']}_batch{row['batch']}_{row['decoding']}": row["over_exact"]
            for row in rows
            if row["decoding"] != "exact"
        },
        "rows": rows,
    }
    if args.compile:
        summary["compile_mode"] = mode
        summary["compiled_identical_tokens"] = all(row["compiled_identical_tokens"] for row in rows)
        summary["compiled_speedup_batch1"] = {
            row["model"]: row["compiled_speedup"]
            for row in rows
            if row["batch"] == 1 and row["decoding"] == "exact"
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
