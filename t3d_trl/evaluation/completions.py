"""Prompts in, completions out: :func:`generate_completions` decodes a list of user messages in batches (left-padded,
sorted by length) and returns them in order as :class:`Generations`, with the numbers the metrics need (tokens,
forward passes, decoding time). ``t3d-trl generate``, the evaluation runner and the lm-eval wrapper all decode
through it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from ..data.prompts import check_known_tokens, encode_prompts
from ..diffusion.forward import max_positions
from ..generation.configuration import DiffusionGenerationConfig
from ..generation.memory import auto_batch_size, peak_memory_gb, reset_peak_memory
from ..generation.sampler import eos_token_ids, left_pad
from ..generation.streamers import StepRelay
from .metrics import throughput

logger = logging.getLogger(__name__)

__all__ = ["Generations", "generate_completions"]


@dataclass
class Generations:
    """Completions of a list of prompts, in the prompts' order.

    Attributes:
        prompts: the exact prompt texts the model saw (chat template applied).
        completions: decoded completions, cut before the first EOS.
        num_tokens: generated tokens per completion, up to and including the first EOS.
        nfe: denoising forward passes spent on each completion.
        finished: the completion ended with an EOS (False: it used the whole ``max_new_tokens``).
        latency: each completion's share of its batch's wall-clock time, in seconds.
    """

    prompts: list[str]
    completions: list[str]
    num_tokens: list[int]
    nfe: list[int]
    finished: list[bool]
    latency: list[float]
    peak_memory_gb: float | None = None  # peak GPU memory while decoding (None off CUDA)

    @property
    def seconds(self) -> float:
        """Wall-clock seconds spent in ``diffusion_generate``."""
        return math.fsum(self.latency)

    @property
    def tokens_per_second(self) -> float:
        """Tokens per second in ``diffusion_generate``; NaN without measured time (:func:`throughput`)."""
        return throughput(sum(self.num_tokens), self.seconds)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def left_fitted(ids: list[int], reserved: int, limit: int | None) -> list[int]:
    """``ids`` cut from the left to fit ``limit`` positions beside ``reserved`` more (None: no limit)."""
    if limit is None or len(ids) + reserved <= limit:
        return ids
    if reserved >= limit:
        raise ValueError(f"{reserved} new tokens leave no room for a prompt in the model's {limit} positions")
    return ids[len(ids) + reserved - limit :]


def _truncate(
    prompts: list[str], ids: list[list[int]], tokenizer: Any, reserved: int, limit: int | None
) -> None:
    """Cut, in place, the prompts that do not fit beside ``reserved`` new tokens from the left, with one warning."""
    cut = 0
    for i, row in enumerate(ids):
        kept = left_fitted(row, reserved, limit)
        if len(kept) < len(row):
            cut += 1
            ids[i], prompts[i] = kept, tokenizer.decode(kept)
    if cut:
        logger.warning(
            "%d of %d prompts are longer than the model's %d positions allow beside max_new_tokens=%d: cut from "
            "the left",
            cut,
            len(ids),
            limit,
            reserved,
        )


def generate_completions(
    model: torch.nn.Module,
    tokenizer: Any,
    messages: Sequence[str],
    generation_config: DiffusionGenerationConfig | Mapping[str, Any] | None = None,
    *,
    use_chat_template: bool = True,
    batch_size: int | None = 8,
    generator: torch.Generator | None = None,
    progress: bool = True,
    desc: str | None = None,
    streamer: Any = None,
    truncate_prompts: bool = False,
) -> Generations:
    """Decode one completion per user message with ``model.diffusion_generate``.

    Messages are wrapped in the tokenizer's chat template (when it has one and ``use_chat_template``),
    sorted by prompt length (longest first, so an out-of-memory batch shows up at once) and decoded in
    left-padded batches of ``batch_size``; results come back in the input order.

    Args:
        model: a model with ``diffusion_generate`` (see :func:`t3d_trl.add_diffusion_generation`).
        tokenizer: its tokenizer.
        messages: user messages.
        generation_config: decoding settings (a config, or a dict of its fields: a whole config, whose missing
            fields take the class defaults); default: the ones saved with the model.
        use_chat_template: wrap messages in the chat template.
        batch_size: prompts per ``diffusion_generate`` call; ``None``: as many as the free GPU memory holds (up
            to 128; 8 on the CPU).
        generator: random generator for sampling (``temperature > 0``) and random remasking.
        progress: show a progress bar.
        desc: its label.
        streamer: a :class:`~t3d_trl.generation.streamers.DiffusionStreamer` that sees every batch's steps (in
            the sorted order) and ends once, after the last; the time it takes does not count as decoding time.
        truncate_prompts: cut prompts that do not fit the model's positions beside ``max_new_tokens`` from the
            left, with a warning, as lm-eval's Hugging Face models do (``prompts`` then holds what was kept);
            False: such a prompt is refused.
    """
    if isinstance(messages, str):
        raise TypeError("messages must be a sequence of str, not a single str")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    config = DiffusionGenerationConfig.parse(generation_config) or model.diffusion_generation_config
    config = config.update(return_dict_in_generate=True, output_history=False)  # a copy: the caller's is kept
    device = next(model.parameters()).device
    eos = torch.tensor(eos_token_ids(model, config), dtype=torch.long, device=device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else int(eos[0]) if len(eos) else 0
    prompts, ids = encode_prompts(tokenizer, messages, use_chat_template)
    check_known_tokens(ids, tokenizer)
    if truncate_prompts:
        _truncate(prompts, ids, tokenizer, config.max_new_tokens, max_positions(model))
    n = len(prompts)
    completions, num_tokens, nfe, finished, latency = [""] * n, [0] * n, [0] * n, [False] * n, [0.0] * n
    order = sorted(range(n), key=lambda i: -len(ids[i]))
    if batch_size is None:
        batch_size = auto_batch_size(model, config, len(ids[order[0]]) if n else 0)
    reset_peak_memory(device)
    relay = StepRelay(streamer)
    with tqdm(total=n, desc=desc, unit="sample", disable=not progress, leave=False) as bar, relay:
        for start in range(0, n, batch_size):
            batch = order[start : start + batch_size]
            input_ids, attention_mask = (t.to(device) for t in left_pad([ids[i] for i in batch], pad_id))
            _synchronize(device)
            began = time.perf_counter()
            out = model.diffusion_generate(
                input_ids, attention_mask, generation_config=config, generator=generator, streamer=relay.batch
            )
            _synchronize(device)
            seconds = time.perf_counter() - began - relay.take_seconds()
            generated = out.sequences[:, input_ids.shape[1] :]
            is_eos = torch.isin(generated, eos) if len(eos) else torch.zeros_like(generated, dtype=torch.bool)
            has_eos = is_eos.any(-1)
            first = torch.where(has_eos, is_eos.long().argmax(-1), generated.shape[1])
            for row, i in enumerate(batch):
                cut = int(first[row])
                completions[i] = tokenizer.decode(generated[row, :cut].tolist(), skip_special_tokens=True)
                finished[i] = bool(has_eos[row])
                num_tokens[i] = cut + int(finished[i])
                nfe[i] = int(out.nfe[row])
                latency[i] = seconds / len(batch)
            bar.update(len(batch))
    peak = peak_memory_gb(device)
    if peak is not None:
        logger.info("peak GPU memory while decoding: %.2f GiB (batch size %d)", peak, batch_size)
    return Generations(prompts, completions, num_tokens, nfe, finished, latency, peak)
