"""Batch sizes from free memory (``generation/memory.py``)."""

from __future__ import annotations

import torch
from testing_utils import build_block_causal_model

from t3d_trl import DiffusionGenerationConfig
from t3d_trl.generation.memory import (
    DEFAULT_BATCH_SIZE,
    MAX_AUTO_BATCH_SIZE,
    auto_batch_size,
    decoding_bytes_per_row,
    peak_memory_gb,
)


def test_auto_batch_size_fits_the_free_memory(tokenizer):
    model = build_block_causal_model(tokenizer)
    config = DiffusionGenerationConfig(max_new_tokens=56, block_length=4)
    assert auto_batch_size(model, config, 4) == DEFAULT_BATCH_SIZE  # the CPU: no free-memory reading
    per_row = decoding_bytes_per_row(model, 64, 4)  # canvas: prompt 4 + 56 new + a block
    # The static cache alone: 2 (keys, values) x layers x kv heads x head dim x canvas x 4 bytes.
    assert per_row > 2 * 2 * 2 * 8 * 64 * 4
    assert auto_batch_size(model, config, 4, free_bytes=10 * per_row, fraction=1.0) == 10
    assert auto_batch_size(model, config, 4, free_bytes=per_row // 2) == 1
    assert auto_batch_size(model, config, 4, free_bytes=10**15) == MAX_AUTO_BATCH_SIZE
    # Guidance decodes an unconditional copy of every row beside it: half the prompts fit.
    guided = config.update(cfg_scale=1.0)
    assert auto_batch_size(model, guided, 4, free_bytes=10 * per_row, fraction=1.0) == 5
    # Sampling holds float64 noise and tempered logits of a block beside the probabilities, filtering a sort.
    sampled = config.update(temperature=1.0)
    assert decoding_bytes_per_row(model, 64, 4, sampling=True) > per_row
    assert decoding_bytes_per_row(model, 64, 4, True, True) > decoding_bytes_per_row(model, 64, 4, True)
    assert auto_batch_size(model, sampled, 4, free_bytes=10 * per_row, fraction=1.0) < 10
    # A longer canvas needs more memory per row.
    assert decoding_bytes_per_row(model, 512, 4) > 8 * per_row
    assert peak_memory_gb(torch.device("cpu")) is None


def test_a_bidirectional_model_is_planned_at_the_block_it_decodes(tokenizer):
    # The sampler ignores a bidirectional model's block_size (one block of max_new_tokens here); so does the plan.
    from testing_utils import build_bidirectional_model

    from t3d_trl import DiffusionConfig

    model = build_bidirectional_model(tokenizer)
    DiffusionConfig(tokenizer.mask_token_id, block_size=4).save_to_model_config(model.config)
    assert model.diffusion_config.block_size == 4
    config = DiffusionGenerationConfig(max_new_tokens=64)
    per_row = decoding_bytes_per_row(model, 4 + 64 + 64, 64)
    assert auto_batch_size(model, config, 4, free_bytes=3 * per_row, fraction=1.0) == 3
