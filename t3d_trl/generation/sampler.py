"""The block-wise masked diffusion sampler behind ``model.diffusion_generate``.

Layout. Prompts come left-padded (``[B, P]``). The generated region of every row holds ``max_new_tokens``
mask tokens and is decoded in blocks of ``block_length`` tokens, left to right.

* Bidirectional models (LLaDA, Dream, BERT-style): the canvas is ``[prompt | masks]`` and blocks start at
  the end of the prompt (LLaDA reference semantics). Every step runs the whole canvas (or, with the
  approximate ``cache="prefix"``/``"dual"``, a window of it), but vocabulary logits are computed only for the
  current block's positions that some row still has masked.
* Block-causal models (SDAR): attention blocks are aligned to absolute position 0 of each row, so the
  prompt's tail shares the first decoding block with the first masks; those prompt tokens are never
  masked or overwritten. Rows are re-laid so that their block boundaries coincide (extra left padding, a
  multiple of the block length). With ``use_cache`` the whole prompt blocks are prefilled once into a KV
  cache; each step runs the current block against the cache, which it does not modify; a finished block's
  keys/values are written by the next block's first step (one forward over both blocks), so no forward
  pass is spent on writing alone.

Schedules. Static decoding splits the ``m`` masks of a block over its ``steps_per_block`` steps (LLaDA: each
step ``m // s``, the first ``m % s`` steps one more); steps whose quota is zero for every row are skipped.
``decode_steps`` records, for every generated token, the global step (1-based, ``block * steps_per_block +
step + 1``) at which it was unmasked; with ``stop_at_eos``, 0 marks a position filled after the completion's
EOS. Dynamic
decoding (``threshold``) counts its steps per row instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import Cache, DynamicCache
from transformers.cache_utils import DynamicLayer

from ..diffusion.config import DiffusionConfig
from ..diffusion.forward import accepts_4d_mask, diffusion_forward
from ..diffusion.masks import (
    block_attention_mask,
    padding_attention_mask,
    position_ids_from_valid,
)
from .configuration import DiffusionGenerationConfig
from .guidance import GuidedRunner
from .remasking import propose_tokens, select_dynamic, select_static, transfer_schedule
from .streamers import DiffusionStreamer, make_step


@dataclass
class DiffusionGenerationOutput:
    """What ``diffusion_generate(..., return_dict_in_generate=True)`` returns.

    Attributes:
        sequences: ``[B, P + max_new_tokens]``: the (left-padded) prompts followed by the completions.
        decode_steps: ``[B, max_new_tokens]``: global 1-based step at which each generated token was unmasked
            (0 = filled with padding after the completion's EOS).
        nfe: ``[B]``: denoising forward passes spent on each row (a block-causal prompt prefill is not
            counted).
        history: with ``output_history``, the generated region after every step (``[B, max_new_tokens]``
            each, mask tokens where still masked).
    """

    sequences: torch.Tensor
    decode_steps: torch.Tensor
    nfe: torch.Tensor
    history: list[torch.Tensor] | None = None


@dataclass
class Canvas:
    """The decoding canvas of a batch: prompts and masked completions laid out as the sampler runs them
    (shared with the factorization-error analyser, which rebuilds teacher states on the same layout)."""

    tokens: torch.Tensor  # [B, T]
    valid: torch.Tensor  # [B, T] bool: prompt or generated position
    position_ids: torch.Tensor  # [B, T]
    gen_index: torch.Tensor  # [B, G] canvas index of each generated position
    blocks: list[tuple[int, int]]  # canvas [start, end) of each decoding block
    prefix: int  # block-causal: canvas positions before the first decoding block (whole prompt blocks)


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch prompts of different lengths the way the sampler wants them: ``(input_ids, attention_mask)``,
    both ``[B, longest]``, padding on the left."""
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            input_ids[i, width - len(row) :] = torch.as_tensor(row)
            attention_mask[i, width - len(row) :] = 1
    return input_ids, attention_mask


def _check_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, prompt_len], got shape {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.long, torch.int, torch.int32):
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if attention_mask is None:
        return torch.ones_like(input_ids, dtype=torch.bool)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} differs from input_ids shape {tuple(input_ids.shape)}"
        )
    valid = attention_mask.bool()
    right_padded = (valid[:, :-1] & ~valid[:, 1:]).any(-1)
    if right_padded.any():
        row = int(right_padded.nonzero()[0])
        raise ValueError(
            f"attention_mask row {row} is right-padded (a real token followed by padding); diffusion_generate "
            "needs left padding: set tokenizer.padding_side = 'left'"
        )
    return valid


def layout_canvas(
    input_ids: torch.Tensor,
    valid: torch.Tensor,
    diffusion: DiffusionConfig,
    block_length: int,
    max_new_tokens: int,
    pad_id: int,
) -> Canvas:
    """Lay left-padded prompts and ``max_new_tokens`` masks out per attention kind (see the module docstring)."""
    batch, width = input_ids.shape
    device = input_ids.device
    lengths = valid.sum(-1)
    mask_id = diffusion.mask_token_id
    if not diffusion.is_block_causal:
        tokens = torch.cat([input_ids, input_ids.new_full((batch, max_new_tokens), mask_id)], dim=1)
        full_valid = torch.cat([valid, valid.new_ones((batch, max_new_tokens))], dim=1)
        gen_index = torch.arange(width, width + max_new_tokens, device=device).expand(batch, -1)
        blocks = [(s, s + block_length) for s in range(width, width + max_new_tokens, block_length)]
        return Canvas(tokens, full_valid, position_ids_from_valid(full_valid), gen_index, blocks, 0)

    tails = lengths % block_length
    prefix = int((lengths - tails).max())
    span = -(-(int(tails.max()) + max_new_tokens) // block_length) * block_length
    total = prefix + span
    starts = prefix - (lengths - tails)  # where each row's prompt begins on the canvas (a block multiple)
    cols = torch.arange(total, device=device).unsqueeze(0)
    offset = cols - starts.unsqueeze(1)
    in_prompt = (offset >= 0) & (offset < lengths.unsqueeze(1))
    in_gen = (offset >= lengths.unsqueeze(1)) & (offset < (lengths + max_new_tokens).unsqueeze(1))
    # Real prompt tokens sit at the end of each left-padded input row.
    src = (offset + (width - lengths).unsqueeze(1)).clamp(0, width - 1)
    tokens = torch.where(in_prompt, input_ids.gather(1, src), torch.full_like(src, pad_id))
    tokens = torch.where(in_gen, torch.full_like(tokens, mask_id), tokens)
    full_valid = in_prompt | in_gen
    position_ids = offset.clamp_min(0) * full_valid
    gen_index = (starts + lengths).unsqueeze(1) + torch.arange(max_new_tokens, device=device).unsqueeze(0)
    blocks = [(s, s + block_length) for s in range(prefix, total, block_length)]
    return Canvas(tokens, full_valid, position_ids, gen_index, blocks, prefix)


def eos_token_ids(model: torch.nn.Module, config: DiffusionGenerationConfig) -> list[int]:
    """EOS ids of a generation: the config's, else the model's generation config or config."""
    eos = config.eos_token_id
    if eos is None:
        generation_config = getattr(model, "generation_config", None)
        eos = getattr(generation_config, "eos_token_id", None) or getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def diffusion_generate(
    model: torch.nn.Module,
    diffusion: DiffusionConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    config: DiffusionGenerationConfig,
    generator: torch.Generator | None = None,
    streamer: DiffusionStreamer | None = None,
) -> torch.Tensor | DiffusionGenerationOutput:
    """Decode ``config.max_new_tokens`` tokens after each prompt. See the module docstring; ``streamer`` (see
    :mod:`t3d_trl.generation.streamers`) sees the canvas after every forward pass."""
    valid = _check_inputs(input_ids, attention_mask)
    input_ids = input_ids.long()
    block_length, steps_per_block = config.resolve(
        diffusion.block_size if diffusion.is_block_causal else None
    )
    vocab = (
        model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None else None
    )
    if vocab is not None and diffusion.mask_token_id >= vocab:
        raise ValueError(
            f"mask_token_id={diffusion.mask_token_id} is outside the model's vocabulary of {vocab}"
        )
    if diffusion.is_block_causal and not accepts_4d_mask(model):
        raise ValueError(
            f"block-causal decoding needs a decoder that takes 4D masks; {type(model).__name__} does not"
        )
    config.check_model(diffusion.is_block_causal, accepts_4d_mask(model))
    lengths = valid.sum(-1)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and int(lengths.max()) + config.max_new_tokens > max_positions:
        raise ValueError(
            f"prompt of {int(lengths.max())} tokens plus max_new_tokens={config.max_new_tokens} exceeds the "
            f"model's max_position_embeddings={max_positions}"
        )
    eos_ids = eos_token_ids(model, config)
    pad_id = config.pad_token_id
    if pad_id is None:
        pad_id = eos_ids[0] if eos_ids else (getattr(model.config, "pad_token_id", None) or 0)

    canvas = layout_canvas(input_ids, valid, diffusion, block_length, config.max_new_tokens, pad_id)

    def build_runner(canvas: Canvas) -> BlockRunner:
        return BlockRunner(model, diffusion, canvas, config.use_cache, config.approximate_cache or "none")

    runner = (
        GuidedRunner(build_runner, canvas, diffusion.mask_token_id, config.cfg_scale)
        if config.cfg_scale
        else build_runner(canvas)
    )
    x = canvas.tokens
    batch, total = x.shape
    mask_id = diffusion.mask_token_id
    device = x.device
    decode_step = torch.zeros_like(x)
    nfe = torch.zeros(batch, dtype=torch.long, device=device)
    dynamic_count = torch.zeros(batch, dtype=torch.long, device=device)
    active = torch.ones(batch, dtype=torch.bool, device=device)
    gen_mask = torch.zeros_like(canvas.valid).scatter_(1, canvas.gen_index, True)
    eos_tensor = torch.tensor(eos_ids, device=device, dtype=torch.long)
    cols = torch.arange(total, device=device)
    history: list[torch.Tensor] | None = [] if config.output_history else None

    for block_idx, (start, end) in enumerate(canvas.blocks):
        block = x[:, start:end]  # a view: commits write into x
        to_decode = gen_mask[:, start:end] & active.unsqueeze(1)
        quota = transfer_schedule(to_decode.sum(-1), steps_per_block, config.schedule, end - start)
        step = 0
        while True:
            masked = (block == mask_id) & active.unsqueeze(1)
            if not masked.any():
                break
            # Past the block's budget (only reachable through dynamic top-up) everything left is committed.
            static_quota = quota[:, step] if step < steps_per_block else masked.sum(-1)
            if config.threshold is None and int(static_quota.max()) == 0:
                step += 1  # nothing scheduled for any row at this step: skip the forward pass
                continue
            # Vocabulary logits only where some row still has a mask: the LM head is a large share of a
            # cached step, and decoded positions never change.
            wanted = masked.any(0).nonzero().squeeze(1)
            x0_wanted, score_wanted = propose_tokens(
                runner.block_logits(x, start, end, wanted),
                config.temperature,
                config.remasking,
                config.top_k,
                config.top_p,
                generator,
                mask_id,
            )
            x0 = block.clone()
            x0[:, wanted] = x0_wanted
            score = torch.full(block.shape, float("-inf"), device=device, dtype=score_wanted.dtype)
            score[:, wanted] = score_wanted
            row_active = masked.any(-1)
            nfe += row_active.long()
            if config.threshold is None:
                commit = select_static(score, masked, static_quota)
                step_id = torch.full_like(nfe, block_idx * steps_per_block + step + 1)
            else:
                topup = static_quota if config.dynamic_rule == "threshold_topup" else None
                commit = select_dynamic(score, masked, config.threshold, topup)
                dynamic_count += row_active.long()
                step_id = dynamic_count
            block[commit] = x0[commit]
            decode_step[:, start:end][commit] = step_id.unsqueeze(1).expand_as(commit)[commit]
            if streamer is not None:
                streamer.put(make_step(x, canvas.gen_index, commit, start, block_idx, step_id, nfe, mask_id))
            step += 1
            if eos_ids and config.stop_at_eos:
                active &= ~_finished(x, gen_mask, eos_tensor, mask_id, cols)
            if history is not None:
                history.append(x.gather(1, canvas.gen_index).clone())
        if not active.any():
            break
    if streamer is not None:
        streamer.end()

    generated = x.gather(1, canvas.gen_index)
    steps_out = decode_step.gather(1, canvas.gen_index)
    if eos_ids and config.stop_at_eos:
        # Everything after a completion's first EOS is padding (and was never decoded by then).
        is_eos = torch.isin(generated, eos_tensor)
        after = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        generated = generated.masked_fill(after, pad_id)
        steps_out = steps_out.masked_fill(after, 0)
    generated = torch.where(generated == mask_id, torch.full_like(generated, pad_id), generated)
    sequences = torch.cat([input_ids, generated], dim=1)
    if not config.return_dict_in_generate:
        return sequences
    return DiffusionGenerationOutput(sequences=sequences, decode_steps=steps_out, nfe=nfe, history=history)


def _finished(
    x: torch.Tensor, gen_mask: torch.Tensor, eos: torch.Tensor, mask_id: int, cols: torch.Tensor
) -> torch.Tensor:
    """Rows whose completion has an EOS with every generated position before it decoded."""
    eos_here = gen_mask & torch.isin(x, eos)
    has_eos = eos_here.any(-1)
    first = torch.where(
        has_eos, eos_here.long().argmax(-1), torch.full_like(has_eos, x.shape[1], dtype=torch.long)
    )
    pending_before = ((x == mask_id) & gen_mask & (cols.unsqueeze(0) < first.unsqueeze(1))).any(-1)
    return has_eos & ~pending_before


class BlockRunner:
    """Runs the model for one denoising step of a block, managing the key/value cache when there is one.

    Block-causal models: the exact block cache (see the module docstring). Bidirectional models with
    ``cache="prefix"`` or ``"dual"`` (Fast-dLLM): the first forward pass of a block runs the whole canvas and
    stores every key/value; later steps of the block run only the block (dual) or the block and everything after
    it (prefix) against that cache, whose keys/values outside the window are those of the canvas at the block's
    start (the window's own are overwritten with fresh ones, see ``WindowCache``). The query window starts one
    position early for shifted-logit models (Dream), whose first block token is read from the position before it.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        diffusion: DiffusionConfig,
        canvas: Canvas,
        use_cache: bool,
        approximate: str = "none",
    ):
        self.model = model
        self.diffusion = diffusion
        self.canvas = canvas
        # Masks are built in the model's compute dtype.
        self.dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        self.is_decoder = accepts_4d_mask(model)
        self.cached = diffusion.is_block_causal and use_cache
        self.approximate = "none" if diffusion.is_block_causal else approximate
        block = max(end - start for start, end in canvas.blocks) if canvas.blocks else 1
        self.block_ids = torch.arange(canvas.tokens.shape[1], device=canvas.tokens.device) // block
        self.full_mask = None
        if not diffusion.is_block_causal:
            self.full_mask = (
                padding_attention_mask(canvas.valid, canvas.tokens.shape[1], self.dtype)
                if self.is_decoder
                else canvas.valid.long()
            )
        self.cache = None
        self.cache_len = 0
        self.cached_block: int | None = None  # approximate cache: start of the block it was refreshed for
        if self.cached:
            self.cache = DynamicCache(config=model.config)
            if canvas.prefix > 0:
                self._forward(
                    canvas.tokens, 0, canvas.prefix, keep=torch.tensor([canvas.prefix - 1]), use_cache=True
                )
                self.cache_len = canvas.prefix

    def _forward(
        self, x: torch.Tensor, q_start: int, q_end: int, keep: torch.Tensor, use_cache: bool
    ) -> torch.Tensor:
        # Keys are the cached prefix [0, q_start) plus this pass's inputs [q_start, q_end).
        mask = block_attention_mask(
            self.block_ids[q_start:q_end].expand(x.shape[0], -1),
            self.block_ids[:q_end].expand(x.shape[0], -1),
            self.canvas.valid[:, :q_end],
            self.dtype,
            query_index=torch.arange(q_start, q_end, device=x.device),
            key_index=torch.arange(q_end, device=x.device),
        )
        logits, self.cache = diffusion_forward(
            self.model,
            self.diffusion,
            x[:, q_start:q_end],
            mask,
            self.canvas.position_ids[:, q_start:q_end],
            keep=keep.to(x.device),
            cache=self.cache,
            use_cache=use_cache,
        )
        return logits

    def block_logits(
        self, x: torch.Tensor, start: int, end: int, cols: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits ``[B, len(cols), V]`` for the tokens of the current block at block offsets ``cols`` (default:
        all ``end - start`` of them)."""
        if cols is None:
            cols = torch.arange(end - start, device=x.device)
        if not self.diffusion.is_block_causal:
            if self.approximate != "none":
                return self._approximate_logits(x, start, end, cols)
            return diffusion_forward(
                self.model, self.diffusion, x, self.full_mask, self.canvas.position_ids, keep=start + cols
            )[0]
        if not self.cached:
            # Reference path: the whole canvas up to the current block; later blocks are invisible anyway.
            return self._forward(x, 0, end, keep=start + cols, use_cache=False)
        q_start = self.cache_len
        logits = self._forward(x, q_start, end, keep=start - q_start + cols, use_cache=True)
        # Keep the keys/values of finished blocks written by this pass; drop the current block's.
        self.cache.crop(-(end - start))
        self.cache_len = start
        return logits

    def _approximate_logits(self, x: torch.Tensor, start: int, end: int, cols: torch.Tensor) -> torch.Tensor:
        q0 = start - 1 if self.diffusion.shift_logits and start > 0 else start
        q1 = end if self.approximate == "dual" else x.shape[1]
        if self.cached_block != start:
            # First step of the block: one pass over the whole canvas refreshes every key/value.
            self.cache = WindowCache()
            logits, _ = diffusion_forward(
                self.model,
                self.diffusion,
                x,
                self.full_mask,
                self.canvas.position_ids,
                keep=start + cols,
                cache=self.cache,
                use_cache=True,
            )
            self.cached_block = start
            return logits
        # Later steps: the window's fresh keys/values overwrite their cached copies in place, so the window's
        # queries see the canvas as refreshed with the window itself up to date (Fast-dLLM's replace).
        self.cache.write_window_at(q0)
        logits, _ = diffusion_forward(
            self.model,
            self.diffusion,
            x[:, q0:q1],
            self.full_mask[:, :, q0:q1],
            self.canvas.position_ids[:, q0:q1],
            keep=start - q0 + cols,
            cache=self.cache,
            use_cache=True,
        )
        return logits


class _WindowLayer(DynamicLayer):
    """A key/value layer that appends (the refreshing full pass), then overwrites a window in place."""

    window_start: int | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.window_start is None:
            return super().update(key_states, value_states, *args, **kwargs)
        end = self.window_start + key_states.shape[-2]
        self.keys[..., self.window_start : end, :] = key_states
        self.values[..., self.window_start : end, :] = value_states
        return self.keys, self.values


class WindowCache(Cache):
    """The approximate (Fast-dLLM) cache: filled by one full pass, then each step's window of queries writes its
    fresh keys/values over their cached copies (``write_window_at``) and attends to the whole canvas. Writing in
    place instead of appending and cropping saves a copy of every layer's cache per step and keeps the mask the
    canvas's own."""

    def __init__(self):
        super().__init__(layer_class_to_replicate=_WindowLayer)

    def write_window_at(self, start: int) -> None:
        """Make every layer write the next pass's keys/values at ``start`` instead of appending them."""
        for layer in self.layers:
            layer.window_start = start
