"""The block-wise masked diffusion sampler behind ``model.diffusion_generate``.

Layout. Prompts come left-padded (``[B, P]``). The generated region of every row holds ``max_new_tokens``
mask tokens and is decoded in blocks of ``block_length`` tokens, left to right.

* Bidirectional models (LLaDA, Dream, BERT-style): the canvas is ``[prompt | masks]`` and blocks start at
  the end of the prompt (LLaDA reference semantics). Every step runs the whole canvas (or, with the
  approximate ``cache_implementation="prefix"``/``"dual"``, a window of it), but vocabulary logits are computed
  only for the current block's positions that some row still has masked (a compiled step: the whole block).
* Block-causal models (SDAR): attention blocks are aligned to absolute position 0 of each row, so the
  prompt's tail shares the first decoding block with the first masks; those prompt tokens are never
  masked or overwritten. Rows are re-laid so that their block boundaries coincide (extra left padding, a
  multiple of the block length). With ``use_cache`` the whole prompt blocks are prefilled once into the
  static KV cache; each step runs the current block against the cache (its own keys/values, written in place,
  are hidden from earlier blocks and rewritten by its next step); a finished block's final keys/values are
  written by the next block's first step (one forward over both blocks), so no forward pass is spent on
  writing alone.

Caches and compilation. Every mode keeps its keys/values in one preallocated
:class:`~t3d_trl.generation.static_cache.StaticKVCache` over the whole canvas, so a mode's steps have fixed
shapes; ``compile`` runs the step's forward through ``torch.compile`` (:mod:`t3d_trl.generation.compiled`).

Schedules. Static decoding splits the ``m`` masks of a block over its ``steps_per_block`` steps (LLaDA: each
step ``m // s``, the first ``m % s`` steps one more); steps whose quota is zero for every row are skipped.
``decode_steps`` records, for every generated token, the global step (1-based, ``block * steps_per_block +
step + 1``) at which it was unmasked; with ``stop_at_eos``, 0 marks a position filled after the completion's
EOS. Dynamic decoding (``threshold``) counts its steps per row instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..diffusion.config import DiffusionConfig, block_offset
from ..diffusion.forward import accepts_4d_mask, checked_vocab_size, max_positions
from ..diffusion.masks import (
    block_attention_mask,
    padding_attention_mask,
    position_ids_from_valid,
)
from .compiled import EagerStep, ForwardSpec, step_for
from .configuration import DiffusionGenerationConfig
from .guidance import GuidedRunner
from .remasking import draw_noise, propose_tokens, select_dynamic, select_static, transfer_schedule
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
    for name, value in (("input_ids", input_ids), ("attention_mask", attention_mask)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{name} must be a torch.Tensor, got {type(value).__name__} (tokenize with return_tensors='pt', "
                "or batch id lists with t3d_trl.generation.sampler.left_pad)"
            )
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, prompt_len], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] == 0:
        raise ValueError("input_ids holds no prompt (batch of 0 rows)")
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

    tails = block_offset(lengths, block_length, True)
    prefix = int((lengths - tails).max())
    span = -(-(int(tails.max()) + max_new_tokens) // block_length) * block_length
    total = prefix + span
    starts = prefix - (lengths - tails)  # where each row's prompt begins on the canvas (a block multiple)
    cols = torch.arange(total, device=device).unsqueeze(0)
    offset = cols - starts.unsqueeze(1)
    in_prompt = (offset >= 0) & (offset < lengths.unsqueeze(1))
    in_gen = (offset >= lengths.unsqueeze(1)) & (offset < (lengths + max_new_tokens).unsqueeze(1))
    # Real prompt tokens sit at the end of each left-padded input row.
    src = (offset + (width - lengths).unsqueeze(1)).clamp(0, max(width - 1, 0))
    prompt = input_ids.gather(1, src) if width else torch.full_like(src, pad_id)  # width 0: no prompt at all
    tokens = torch.where(in_prompt, prompt, torch.full_like(src, pad_id))
    tokens = torch.where(in_gen, torch.full_like(tokens, mask_id), tokens)
    full_valid = in_prompt | in_gen
    position_ids = offset.clamp_min(0) * full_valid
    gen_index = (starts + lengths).unsqueeze(1) + torch.arange(max_new_tokens, device=device).unsqueeze(0)
    blocks = [(s, s + block_length) for s in range(prefix, total, block_length)]
    return Canvas(tokens, full_valid, position_ids, gen_index, blocks, prefix)


def eos_token_ids(model: torch.nn.Module, config: DiffusionGenerationConfig) -> list[int]:
    """EOS ids of a generation: the config's, else the model's generation config or config."""
    eos = config.eos_token_id
    if eos is None:  # `is None`, not `or`: 0 is an EOS id (GPT-NeoX / Pythia tokenizers)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def cache_settings(config: DiffusionGenerationConfig) -> tuple[bool, str]:
    """``(use_cache, approximate cache)`` of a generation: the one place the sampler reads the cache settings."""
    return config.use_cache, config.approximate_cache or "none"


def _check_model(
    model: torch.nn.Module,
    diffusion: DiffusionConfig,
    config: DiffusionGenerationConfig,
    valid: torch.Tensor,
    eos_ids: list[int],
) -> None:
    """Refuse settings the model cannot decode with, naming the value."""
    vocab = checked_vocab_size(model, diffusion)
    for name, ids in (
        ("eos_token_id", eos_ids),
        ("pad_token_id", [config.pad_token_id]),
    ):
        bad = [i for i in ids if i is not None and not 0 <= i < vocab or i == diffusion.mask_token_id]
        if bad:  # a mask id would read as undecoded, an id past the vocabulary fails in the tokenizer
            raise ValueError(
                f"{name}={bad[0]} is not a token the model can emit other than its mask "
                f"(vocabulary of {vocab}, mask_token_id={diffusion.mask_token_id})"
            )
    is_decoder = accepts_4d_mask(model)
    if diffusion.is_block_causal and not is_decoder:
        raise ValueError(
            f"block-causal decoding needs a decoder that takes 4D masks; {type(model).__name__} does not"
        )
    config.check_model(diffusion.is_block_causal, is_decoder)
    lengths = valid.sum(-1)
    if diffusion.shift_logits and not lengths.all():
        empty = (lengths == 0).nonzero().flatten().tolist()
        raise ValueError(
            f"row(s) {empty} have an empty prompt: a shifted-logit model (Dream) predicts each token from the "
            "position before it, which the first generated token would not have; start the prompt with BOS"
        )
    longest = int(lengths.max())
    limit = max_positions(model)
    if limit is not None and longest + config.max_new_tokens > limit:
        raise ValueError(
            f"prompt of {longest} tokens plus max_new_tokens={config.max_new_tokens} exceeds the "
            f"model's max_position_embeddings={limit}"
        )


@dataclass
class DecodingState:
    """What a generation carries from step to step (all ``[B, T]`` canvas-shaped or ``[B]``)."""

    x: torch.Tensor  # the canvas; commits write into it
    gen_mask: torch.Tensor  # generated positions
    decode_step: torch.Tensor  # step at which each position was unmasked
    nfe: torch.Tensor  # forward passes spent on each row
    dynamic_count: torch.Tensor  # dynamic decoding: steps taken by each row
    active: torch.Tensor  # rows still decoding

    @classmethod
    def start(cls, canvas: Canvas) -> DecodingState:
        x = canvas.tokens
        rows = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        gen_mask = torch.zeros_like(canvas.valid).scatter_(1, canvas.gen_index, True)
        return cls(
            x, gen_mask, torch.zeros_like(x), rows, rows.clone(), torch.ones_like(rows, dtype=torch.bool)
        )


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
    :mod:`t3d_trl.generation.streamers`) sees the canvas after every forward pass, and its ``end`` is called
    however decoding ends (an error too, so that a consumer in another thread is not left waiting)."""
    if streamer is not None and not isinstance(streamer, DiffusionStreamer):
        raise TypeError(
            f"streamer must be a DiffusionStreamer (TerminalStreamer, DiffusionIteratorStreamer or a subclass), "
            f"got {type(streamer).__name__}: transformers' streamers take the ids of left-to-right decoding"
        )
    try:
        return _generate(model, diffusion, input_ids, attention_mask, config, generator, streamer)
    finally:
        if streamer is not None:
            streamer.end()


def _generate(
    model: torch.nn.Module,
    diffusion: DiffusionConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    config: DiffusionGenerationConfig,
    generator: torch.Generator | None,
    streamer: DiffusionStreamer | None,
) -> torch.Tensor | DiffusionGenerationOutput:
    valid = _check_inputs(input_ids, attention_mask)
    input_ids = input_ids.long()
    block_length, steps_per_block = config.resolve(
        diffusion.block_size if diffusion.is_block_causal else None
    )
    eos_ids = eos_token_ids(model, config)
    _check_model(model, diffusion, config, valid, eos_ids)
    pad_id = config.pad_token_id
    if pad_id is None:
        pad_id = eos_ids[0] if eos_ids else (getattr(model.config, "pad_token_id", None) or 0)

    canvas = layout_canvas(input_ids, valid, diffusion, block_length, config.max_new_tokens, pad_id)
    use_cache, approximate = cache_settings(config)
    step_runner = step_for(model, config.compile)

    def build_runner(canvas: Canvas) -> BlockRunner:
        return BlockRunner(model, diffusion, canvas, use_cache, approximate, step=step_runner)

    runner = (
        GuidedRunner(build_runner, canvas, diffusion.mask_token_id, config.cfg_scale)
        if config.cfg_scale
        else build_runner(canvas)
    )
    state = DecodingState.start(canvas)
    mask_id = diffusion.mask_token_id
    eos_tensor = torch.tensor(eos_ids, device=state.x.device, dtype=torch.long)
    history: list[torch.Tensor] | None = [] if config.output_history else None

    for block_idx, (start, end) in enumerate(canvas.blocks):
        block = state.x[:, start:end]  # a view: commits write into the canvas
        in_gen = state.gen_mask[:, start:end]
        quota = transfer_schedule(
            (in_gen & state.active.unsqueeze(1)).sum(-1), steps_per_block, config.schedule, end - start
        )
        step = 0
        while True:
            # Only generated positions: a mask token in a prompt's tail sharing the block is the prompt's.
            masked = (block == mask_id) & in_gen & state.active.unsqueeze(1)
            if not masked.any():
                break
            # Past the block's budget (only reachable through dynamic top-up) everything left is committed.
            static_quota = quota[:, step] if step < steps_per_block else masked.sum(-1)
            if config.threshold is None and int(static_quota.max()) == 0:
                step += 1  # nothing scheduled for any row at this step: skip the forward pass
                continue
            step_id = block_idx * steps_per_block + step + 1
            commit, step_ids = denoise_step(
                runner, state, config, (start, end), masked, static_quota, step_id, generator
            )
            if streamer is not None:
                streamer.put(
                    make_step(
                        state.x, canvas.gen_index, commit, start, block_idx, step_ids, state.nfe, mask_id
                    )
                )
            step += 1
            if eos_ids and config.stop_at_eos:
                state.active &= ~_finished(state.x, state.gen_mask, eos_tensor, mask_id)
            if history is not None:
                history.append(state.x.gather(1, canvas.gen_index).clone())
        if not state.active.any():
            break

    generated = state.x.gather(1, canvas.gen_index)
    steps_out = state.decode_step.gather(1, canvas.gen_index)
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
    return DiffusionGenerationOutput(
        sequences=sequences, decode_steps=steps_out, nfe=state.nfe, history=history
    )


def denoise_step(
    runner: BlockRunner,
    state: DecodingState,
    config: DiffusionGenerationConfig,
    window: tuple[int, int],
    masked: torch.Tensor,
    quota: torch.Tensor,
    step_id: int,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One denoising step of the block ``window = (start, end)``: propose tokens for its masked positions
    (``masked``, ``[B, L]``) and commit ``quota`` of them (static) or those above the threshold (dynamic).
    Returns the block's commit mask and each row's step id."""
    start, end = window
    block = state.x[:, start:end]
    # Eager: vocabulary logits only where some row still has a mask (the LM head is a large share of a cached
    # step). Compiled: the whole block, so that every step has the same shapes.
    cols = None if runner.step.compiled else masked.any(0).nonzero().squeeze(1)
    logits = runner.block_logits(state.x, start, end, cols)
    # Noise is drawn for the whole block whichever columns are computed: eager and compiled draw the same.
    noise = draw_noise(
        (*block.shape, logits.shape[-1]), config.temperature, config.remasking, generator, block.device
    )
    if cols is not None:
        noise = tuple(None if n is None else n[:, cols] for n in noise)
    x0, score = propose_tokens(
        logits, config.temperature, config.remasking, config.top_k, config.top_p, None, runner.mask_id, noise
    )
    if cols is not None:
        x0 = block.clone().index_copy_(1, cols, x0)
        score = torch.full(block.shape, float("-inf"), dtype=score.dtype, device=block.device).index_copy_(
            1, cols, score
        )
    row_active = masked.any(-1)
    if config.threshold is None:
        # A row with nothing scheduled now would skip this step alone: not its forward.
        row_active &= quota > 0
        commit = select_static(score, masked, quota)
        step_ids = torch.full_like(state.nfe, step_id)
    else:
        topup = quota if config.dynamic_rule == "threshold_topup" else None
        commit = select_dynamic(score, masked, config.threshold, topup)
        state.dynamic_count += row_active.long()
        step_ids = state.dynamic_count
    state.nfe += row_active.long()
    block[commit] = x0[commit]
    state.decode_step[:, start:end][commit] = step_ids.unsqueeze(1).expand_as(commit)[commit]
    return commit, step_ids


def _finished(x: torch.Tensor, gen_mask: torch.Tensor, eos: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Rows whose completion has an EOS with every generated position before it decoded."""
    eos_here = gen_mask & torch.isin(x, eos)
    has_eos = eos_here.any(-1)
    first = torch.where(
        has_eos, eos_here.long().argmax(-1), torch.full_like(has_eos, x.shape[1], dtype=torch.long)
    )
    cols = torch.arange(x.shape[1], device=x.device)
    pending_before = ((x == mask_id) & gen_mask & (cols.unsqueeze(0) < first.unsqueeze(1))).any(-1)
    return has_eos & ~pending_before


class BlockRunner:
    """Runs the model for one denoising step of a block over a static key/value cache when there is one.

    Every mode keeps the keys/values of the whole canvas in one preallocated :class:`StaticKVCache`, written at
    fixed canvas positions, and attends to all of it through a canvas-wide mask, so the shapes of a step do not
    change as decoding proceeds.

    * Block-causal models with ``use_cache``: the exact block cache (see the module docstring). A step runs the
      current block (on a block's first step, the finished block before it too, which writes its final
      keys/values) against the cache; later blocks are hidden by the block-causal mask.
    * Bidirectional models with ``approximate="prefix"`` or ``"dual"`` (Fast-dLLM): the first step of a block
      runs the whole canvas and writes every key/value; later steps run only the block (dual) or the block and
      everything after it (prefix), writing the window's fresh keys/values over their cached copies (Fast-dLLM's
      replace), so the window sees the canvas as of the block's start with itself up to date. The window starts
      one position early for shifted-logit models (Dream), whose first block token is read from the position
      before it.
    * No cache: every step runs the whole canvas (block-causal: up to the current block), a fixed canvas.

    Args:
        step: runs the forward pass and the proposal (eager, or a model's compiled step); default eager.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        diffusion: DiffusionConfig,
        canvas: Canvas,
        use_cache: bool,
        approximate: str = "none",
        step: EagerStep | None = None,
    ):
        self.model = model
        self.diffusion = diffusion
        self.canvas = canvas
        self.mask_id = diffusion.mask_token_id
        self.step = step or step_for(model, None)
        # Masks are built in the model's compute dtype.
        self.dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        self.spec = ForwardSpec.of(model, diffusion)
        self.is_decoder = self.spec.decoder
        self.cached = diffusion.is_block_causal and use_cache
        self.approximate = "none" if diffusion.is_block_causal else approximate
        batch, total = canvas.tokens.shape
        device = canvas.tokens.device
        self.mask = self._canvas_mask()
        self.cache = None
        if self.cached or self.approximate != "none":
            self.cache = self.step.cache(model, batch, total, self.dtype, device)
        self.cache_len = 0  # block-causal: canvas positions whose final keys/values are cached
        self.cached_block: int | None = None  # approximate cache: start of the block it was refreshed for
        if self.cached and canvas.prefix > 0:
            # The whole prompt blocks, once (logits of one position only: nothing reads them).
            self._run(canvas.tokens, 0, canvas.prefix, torch.tensor([canvas.prefix - 1], device=device), True)
            self.cache_len = canvas.prefix

    def _canvas_mask(self) -> torch.Tensor:
        """``[B, 1, T, T]`` additive mask of the whole canvas (decoders), ``[B, T]`` padding mask (encoders)."""
        valid = self.canvas.valid
        if not self.is_decoder:
            return valid.long()
        if not self.diffusion.is_block_causal:
            return padding_attention_mask(valid, valid.shape[1], self.dtype)
        block = max(end - start for start, end in self.canvas.blocks) if self.canvas.blocks else 1
        block_ids = (torch.arange(valid.shape[1], device=valid.device) // block).expand(valid.shape[0], -1)
        return block_attention_mask(block_ids, block_ids, valid, self.dtype)

    def _window(
        self, x: torch.Tensor, q0: int, q1: int, cached: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Inputs, mask rows and positions of the queries ``[q0, q1)``; keys: the whole canvas with a cache,
        else ``[0, q1)``."""
        if not self.is_decoder:
            mask = self.mask
        else:
            mask = self.mask[:, :, q0:q1, : (self.mask.shape[-1] if cached else q1)]
        return x[:, q0:q1], mask, self.canvas.position_ids[:, q0:q1]

    def _run(self, x: torch.Tensor, q0: int, q1: int, keep: torch.Tensor, cached: bool) -> torch.Tensor:
        cache = None
        if cached:
            self.cache.write_window_at(q0)
            cache = self.cache
        return self.step.forward(self.model, self.spec, *self._window(x, q0, q1, cached), keep - q0, cache)

    def block_logits(
        self, x: torch.Tensor, start: int, end: int, cols: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits ``[B, len(cols), V]`` for the tokens of the current block at block offsets ``cols`` (default:
        all ``end - start`` of them)."""
        if cols is None:
            cols = torch.arange(end - start, device=x.device)
        keep = start + cols
        total = x.shape[1]
        if not self.diffusion.is_block_causal:
            if self.approximate == "none":
                return self._run(x, 0, total, keep, cached=False)
            if self.cached_block != start:
                # First step of the block: one pass over the whole canvas refreshes every key/value.
                self.cached_block = start
                return self._run(x, 0, total, keep, cached=True)
            q0 = start - 1 if self.diffusion.shift_logits and start > 0 else start
            return self._run(x, q0, end if self.approximate == "dual" else total, keep, cached=True)
        if not self.cached:
            # Reference path: the whole canvas up to the current block; later blocks are invisible anyway.
            return self._run(x, 0, end, keep, cached=False)
        # From the first position whose final keys/values are not cached yet: on a block's first step that
        # includes the block before it, now finished.
        logits = self._run(x, self.cache_len, end, keep, cached=True)
        self.cache_len = start
        return logits
