"""Peak memory of ``convert_checkpoint`` against the largest source shard, next to load-everything-then-save.

Builds a synthetic LLaDA-layout checkpoint (published names, bf16) of ``--shards`` shards of about
``--shard-mb`` MB each in a temporary folder, then converts it twice, each in a fresh child process:

* ``convert``: ``t3d_trl.models.convert.convert_checkpoint`` (streams shard by shard);
* ``load+save``: ``AutoModelForDiffusionLM.from_pretrained(src).save_pretrained(dst)`` (holds the whole model).

Each child measures its peak resident memory above its own baseline taken after imports (Linux: the kernel's
``VmHWM`` high-water mark, reset through ``/proc/self/clear_refs``; elsewhere ``ru_maxrss``). Temporary files
are removed. The last line printed is one JSON object.

    python benchmarks/bench_convert.py [--shards 4] [--shard-mb 256]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from smoke import parse_with_quick


def _rss_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _child(mode: str, src: str, dst: str) -> None:
    """Run one conversion and print ``{"seconds", "peak_extra_bytes"}``."""
    from t3d_trl import AutoModelForDiffusionLM
    from t3d_trl.models.convert import convert_checkpoint

    baseline = _rss_kb("VmRSS")
    reset = False
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the VmHWM high-water mark to the current RSS
        reset = True
    except OSError:
        pass
    if baseline is None:
        baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if mode == "convert":
        convert_checkpoint(src, dst)
    else:
        AutoModelForDiffusionLM.from_pretrained(src).save_pretrained(dst)
    seconds = time.perf_counter() - start
    peak = _rss_kb("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_extra_bytes": (peak - baseline) * 1024}))


def build_checkpoint(path: Path, shards: int, shard_mb: int, d_model: int = 2048, vocab: int = 16384) -> int:
    """Write a LLaDA-layout bf16 checkpoint of ``shards`` shards (two blocks each); returns the largest shard size."""
    from safetensors.torch import save_file

    heads = 16
    block_bytes = 2 * (4 * d_model * d_model)  # bf16 attention projections
    mlp = max(256, (shard_mb * 2**20 // 2 - block_bytes) // (2 * 3 * d_model) // 256 * 256)
    config = {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "d_model": d_model,
        "n_layers": 2 * shards,
        "n_heads": heads,
        "n_kv_heads": heads,
        "mlp_hidden_size": mlp,
        "vocab_size": vocab,
        "embedding_size": vocab,
        "max_sequence_length": 4096,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "activation_type": "silu",
        "block_type": "llama",
        "layer_norm_type": "rms",
        "weight_tying": False,
        "mask_token_id": vocab - 1,
        "eos_token_id": vocab - 2,
        "pad_token_id": vocab - 2,
        "torch_dtype": "bfloat16",
    }
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(0)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.bfloat16)

    weight_map = {}
    for s in range(shards):
        part = {}
        if s == 0:
            part["model.transformer.wte.weight"] = w(vocab, d_model)
        for layer in (2 * s, 2 * s + 1):
            b = f"model.transformer.blocks.{layer}."
            part |= {
                b + n + ".weight": torch.ones(d_model, dtype=torch.bfloat16) for n in ("attn_norm", "ff_norm")
            }
            part |= {
                b + n + ".weight": w(d_model, d_model) for n in ("q_proj", "k_proj", "v_proj", "attn_out")
            }
            part |= {b + n + ".weight": w(mlp, d_model) for n in ("ff_proj", "up_proj")}
            part[b + "ff_out.weight"] = w(d_model, mlp)
        if s == shards - 1:
            part["model.transformer.ln_f.weight"] = torch.ones(d_model, dtype=torch.bfloat16)
            part["model.transformer.ff_out.weight"] = w(vocab, d_model)
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, path / name, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, name)
        del part
    index = {
        "metadata": {"total_size": sum(f.stat().st_size for f in path.glob("*.safetensors"))},
        "weight_map": weight_map,
    }
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return max(f.stat().st_size for f in path.glob("*.safetensors"))


def _run(mode: str, src: Path, dst: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(src), str(dst)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mb", type=int, default=256)
    parser.add_argument("--child", nargs=3, metavar=("MODE", "SRC", "DST"), help=argparse.SUPPRESS)
    args = parse_with_quick(parser, {"shards": 2, "shard_mb": 2})
    if args.child:
        _child(*args.child)
        return
    if args.quick:
        if args.shards < 1 or args.shard_mb < 1:
            parser.error("--shards and --shard-mb must be >= 1")
    elif args.shards < 4 or args.shard_mb < 200:
        parser.error("the acceptance setting needs at least 4 shards of at least 200 MB")

    with tempfile.TemporaryDirectory(prefix="bench_convert_") as tmp:
        src = Path(tmp) / "src"
        largest = build_checkpoint(src, args.shards, args.shard_mb, *((256, 1024) if args.quick else ()))
        total = sum(f.stat().st_size for f in src.glob("*.safetensors"))
        results = {}
        for mode in ("convert", "load+save"):
            dst = Path(tmp) / mode.replace("+", "_")
            results[mode] = _run(mode, src, dst)
            for f in dst.iterdir():
                f.unlink()

    mb = 2**20
    print(
        f"checkpoint: {args.shards} shards, largest {largest / mb:.0f} MB, total {total / mb:.0f} MB (bf16, LLaDA layout)"
    )
    print(f"{'method':<12}{'peak extra RSS (MB)':>22}{'/ largest shard':>18}{'seconds':>10}")
    for mode, r in results.items():
        print(
            f"{mode:<12}{r['peak_extra_bytes'] / mb:>22.0f}{r['peak_extra_bytes'] / largest:>18.2f}{r['seconds']:>10.1f}"
        )
    convert, naive = results["convert"], results["load+save"]
    print(
        json.dumps(
            {
                "shards": args.shards,
                "largest_shard_mb": round(largest / mb, 1),
                "total_mb": round(total / mb, 1),
                "convert_peak_extra_mb": round(convert["peak_extra_bytes"] / mb, 1),
                "peak_extra_rss_over_largest_shard": round(convert["peak_extra_bytes"] / largest, 3),
                "load_save_peak_extra_mb": round(naive["peak_extra_bytes"] / mb, 1),
                "load_save_peak_over_largest_shard": round(naive["peak_extra_bytes"] / largest, 3),
                "load_save_over_convert_peak": round(
                    naive["peak_extra_bytes"] / convert["peak_extra_bytes"], 2
                ),
                "convert_seconds": round(convert["seconds"], 2),
                "load_save_seconds": round(naive["seconds"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
