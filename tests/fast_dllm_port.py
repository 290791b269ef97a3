"""An independent port of Fast-dLLM's approximate-cache samplers (prefix and dual cache, LLaDA), the reference
that ``tests/test_generation.py`` checks the sampler's ``cache="prefix"`` / ``"dual"`` against token for token,
and that ``benchmarks/bench_generation.py`` times and checks too (it imports this file: one copy).

Written from the algorithm's description (Fast-dLLM's ``generate_with_prefix_cache`` /
``generate_with_dual_cache`` and ``get_transfer_index``), not copied, on a native transformers decoder.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from t3d_trl.models.forward import cache_keyword

__all__ = ["fast_dllm_generate"]


def _fast_dllm_transfer(logits, region, mask_index, quota, threshold, mask_id):
    """Fast-dLLM's ``get_transfer_index``, greedy, ``low_confidence``: commit the ``quota`` most confident
    masked positions, or (threshold) the most confident one and every other one at or above the threshold."""
    x0 = logits.index_fill(-1, torch.tensor([mask_id]), float("-inf")).argmax(-1)
    probs = torch.softmax(logits.double(), dim=-1)
    confidence = probs.gather(-1, x0.unsqueeze(-1)).squeeze(-1)
    confidence = torch.where(mask_index, confidence, torch.tensor(-float("inf"), dtype=torch.float64))
    x0 = torch.where(mask_index, x0, region)
    transfer = torch.zeros_like(mask_index)
    counts = mask_index.sum(1) if threshold is not None else quota
    for row in range(confidence.shape[0]):
        values, top = torch.topk(confidence[row], k=int(counts[row]))
        keep = torch.ones_like(top, dtype=torch.bool)
        if threshold is not None:
            keep[1:] = values[1:] >= threshold
        transfer[row, top[keep]] = True
    region[transfer] = x0[transfer]


@torch.no_grad()
def fast_dllm_generate(model, prompt, steps, gen_length, block_length, cache, threshold=None, *, mask_id):
    """A port of Fast-dLLM's ``generate_with_prefix_cache`` / ``generate_with_dual_cache`` (LLaDA), greedy, on
    a native transformers decoder (bidirectional through an all-zero 4D mask, no padding).

    Per block: one pass over the whole canvas decodes the first step and gives every key/value; the cache
    keeps the keys/values before the block (prefix) or before and after it (dual: the block's slice is cut out
    and its fresh keys/values are appended at every step). Later steps run the block and the suffix (prefix)
    or the block alone (dual) against a fresh copy of that cache. Returns ``(x, nfe)``.
    """
    batch, prompt_len = prompt.shape
    x = torch.full((batch, prompt_len + gen_length), mask_id, dtype=torch.long)
    x[:, :prompt_len] = prompt
    positions = torch.arange(x.shape[1]).unsqueeze(0).expand(batch, -1)
    keyword = cache_keyword(model)
    steps_per_block = steps // (gen_length // block_length)
    nfe = 0
    for start in range(prompt_len, x.shape[1], block_length):
        end = start + block_length
        counts = (x[:, start:end] == mask_id).sum(1, keepdim=True)
        schedule = (
            counts // steps_per_block
            + (torch.arange(steps_per_block).unsqueeze(0) < (counts % steps_per_block)).long()
        )
        full = DynamicCache(config=model.config)
        zeros = torch.zeros(batch, 1, x.shape[1], x.shape[1])
        logits = model(
            input_ids=x, attention_mask=zeros, position_ids=positions, use_cache=True, **{keyword: full}
        ).logits
        mask_index = x == mask_id
        mask_index[:, end:] = False
        _fast_dllm_transfer(logits, x, mask_index, schedule[:, 0], threshold, mask_id)
        nfe += 1
        layers = [(layer.keys, layer.values) for layer in full.layers]
        if cache == "prefix":
            kept = [(k[:, :, :start], v[:, :, :start]) for k, v in layers]
            window = (start, x.shape[1])
        else:
            kept = [
                (
                    torch.cat([k[:, :, :start], k[:, :, end:]], 2),
                    torch.cat([v[:, :, :start], v[:, :, end:]], 2),
                )
                for k, v in layers
            ]
            window = (start, end)
        step = 1
        while (x[:, start:end] == mask_id).any():
            past = DynamicCache(ddp_cache_data=kept, config=model.config)
            ids = x[:, window[0] : window[1]]
            zeros = torch.zeros(batch, 1, ids.shape[1], kept[0][0].shape[2] + ids.shape[1])
            logits = model(
                input_ids=ids,
                attention_mask=zeros,
                position_ids=positions[:, window[0] : window[1]],
                use_cache=True,
                **{keyword: past},
            ).logits
            mask_index = ids == mask_id
            mask_index[:, block_length:] = False
            quota = schedule[:, step] if step < steps_per_block else mask_index.sum(1)
            _fast_dllm_transfer(logits, x[:, window[0] : window[1]], mask_index, quota, threshold, mask_id)
            nfe += 1
            step += 1
    return x, nfe
