"""Batch sizes from free accelerator memory, and peak-memory readings, for decoding at large batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .configuration import DiffusionGenerationConfig

DEFAULT_BATCH_SIZE = 8  # the CPU's, and any device's whose free memory cannot be read
MAX_AUTO_BATCH_SIZE = 128


def decoding_bytes_per_row(
    model: torch.nn.Module,
    canvas_length: int,
    block_length: int,
    sampling: bool = False,
    filtering: bool = False,
) -> int:
    """An upper estimate of the accelerator memory one row of a batch needs while decoding.

    Counts the static key/value cache of the whole canvas, the canvas-wide attention mask, the activations of a
    full-canvas forward pass (the no-cache and the approximate caches' first step; a block-causal step is
    smaller) and the float32 logits and float64 probabilities of a block; with ``sampling`` (temperature > 0)
    the float64 uniforms, Gumbel noise and tempered logits of a block too, and with ``filtering`` (top-k or
    top-p) the float64 sort and its indices.
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    element = next((p.element_size() for p in model.parameters() if p.is_floating_point()), 4)
    hidden = config.hidden_size
    heads = getattr(config, "num_attention_heads", 1)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    intermediate = getattr(config, "intermediate_size", 4 * hidden)
    layers = config.num_hidden_layers
    vocab = config.vocab_size
    t = canvas_length
    kv_cache = 2 * layers * kv_heads * head_dim * t * element
    mask = t * t * element
    # One layer's live activations over the canvas: residual, q/k/v, attention scores, gated MLP.
    activations = t * (4 * hidden + 3 * intermediate) * element + heads * t * t * element
    logits = (
        block_length * vocab * (4 + 8 + 8 + (32 if sampling else 0) + (24 if sampling and filtering else 0))
    )
    return kv_cache + mask + activations + logits


def auto_batch_size(
    model: torch.nn.Module,
    config: DiffusionGenerationConfig,
    longest_prompt: int,
    free_bytes: int | None = None,
    fraction: float = 0.8,
) -> int:
    """How many prompts to decode together with ``config``: as many as ``fraction`` of the free accelerator
    memory holds (at most ``MAX_AUTO_BATCH_SIZE``), or ``DEFAULT_BATCH_SIZE`` on the CPU.

    Args:
        config: the decoding settings; the canvas is ``longest_prompt`` plus ``max_new_tokens`` (plus a block of
            alignment), and guidance (``cfg_scale > 0``) runs an unconditional copy of every row beside it.
        longest_prompt: tokens of the longest prompt.
        free_bytes: free memory to plan with; default: read from the model's CUDA device.
    """
    if free_bytes is None:
        device = next(model.parameters()).device
        if device.type != "cuda":
            return DEFAULT_BATCH_SIZE
        free_bytes, _ = torch.cuda.mem_get_info(device)
    diffusion = model.diffusion_config  # the sampler's rule: a block size is a block-causal model's only
    block = config.block_length or (diffusion.block_size if diffusion.is_block_causal else None)
    block = block or config.max_new_tokens
    sampling, filtering = config.temperature > 0, config.top_k is not None or config.top_p is not None
    per_row = decoding_bytes_per_row(
        model, longest_prompt + config.max_new_tokens + block, block, sampling, filtering
    )
    per_row *= 2 if config.cfg_scale > 0 else 1
    return max(1, min(MAX_AUTO_BATCH_SIZE, int(free_bytes * fraction) // per_row))


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory reading on a CUDA device (no-op elsewhere)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gb(device: torch.device) -> float | None:
    """Peak allocated memory since the last :func:`reset_peak_memory` in GiB, ``None`` off CUDA."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30
