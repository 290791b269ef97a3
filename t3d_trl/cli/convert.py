"""``t3d-trl convert``: turn a published LLaDA, SDAR or Dream checkpoint into a native transformers one.

    t3d-trl convert GSAI-ML/LLaDA-8B-Instruct ./llada-8b-instruct-native --dtype bfloat16

The result loads with plain ``AutoModelForCausalLM.from_pretrained`` (no remote code) and with
``AutoModelForDiffusionLM.from_pretrained``, ready for ``diffusion_generate``. The conversion streams the
weights shard by shard, so it needs about one shard of memory. See :func:`t3d_trl.models.convert.convert_checkpoint`.
"""

from __future__ import annotations

import argparse

from .parsing import ArgumentParser


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="t3d-trl convert", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("src", help="published checkpoint: local folder or Hub repo id")
    parser.add_argument("dst", help="new (or empty) folder for the converted checkpoint")
    parser.add_argument(
        "--max_shard_size",
        default=None,
        type=lambda text: int(text) if text.isdigit() else text,  # bytes, or a size such as 5GB
        help="largest output shard, in bytes or e.g. 5GB (default: the largest source shard)",
    )
    parser.add_argument("--dtype", default=None, help="cast the weights, e.g. bfloat16 (default: keep)")
    parser.add_argument("--revision", default=None, help="Hub revision of SRC")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    from ..models.convert import convert_checkpoint

    dst = convert_checkpoint(
        args.src, args.dst, max_shard_size=args.max_shard_size, dtype=args.dtype, revision=args.revision
    )
    print(f"converted {args.src} -> {dst}")
    return 0
