"""What :class:`~t3d_trl.T3DTrainer` refuses before training: a student it cannot train, a launch that would
train copies of the model instead of one model together."""

from __future__ import annotations

import os
from typing import Any

from transformers import PreTrainedModel

from ..diffusion.config import DiffusionConfig, require_diffusion_config
from ..diffusion.forward import accepts_4d_mask, checked_vocab_size
from ..utils import check_process_count


def check_student(inner: PreTrainedModel) -> tuple[DiffusionConfig, int]:
    """(the diffusion description, the vocabulary size) of a student the trainer can train."""
    diffusion = require_diffusion_config(inner)
    vocab = checked_vocab_size(inner, diffusion)
    if diffusion.is_block_causal and not accepts_4d_mask(inner):
        raise ValueError(
            f"block-causal training needs a decoder taking 4D masks; {type(inner).__name__} is not"
        )
    if diffusion.is_block_causal and diffusion.shift_logits:
        raise ValueError("block-causal training of a model with shifted logits is not supported")
    return diffusion, vocab


def check_launch(
    world_size: int, output_dir: Any, *, fsdp: bool, deepspeed: bool, distributed_type: str
) -> None:
    """Stop a multi-process launch that would not train one model together (it would train N copies)."""
    check_process_count(
        world_size,
        "training",
        f"each process would train its own copy of the model and all would save to {output_dir}",
    )
    # accelerate turns a launch into FSDP or DeepSpeed only on GPUs (and other accelerators): on CPU
    # processes (use_cpu) it sets up plain data parallel, each process holding the whole model.
    for name, enabled in (("FSDP", fsdp), ("DeepSpeed", deepspeed)):
        if os.environ.get(f"ACCELERATE_USE_{name.upper()}", "").lower() == "true" and not enabled:
            raise ValueError(
                f"the launcher asked for {name} but accelerate set up {distributed_type}: accelerate shards "
                f"with {name} on GPUs only, on CPU processes every process would hold the whole model. Use a "
                "MULTI_GPU config (plain data parallel) on CPUs; sharding on CPU processes is shown with torch "
                "FSDP2 directly in benchmarks/bench_distributed.py (docs/recipes.md#several-cpu-processes)"
            )
