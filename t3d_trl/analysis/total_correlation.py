"""Factorization error of few-step decoding: conditional total correlation TC(x_s | x_t) (T3D paper, Eq. tc).

A few-step decoder commits several masked tokens in one step, each drawn from its own one-shot marginal
``p(x_j | x_t)``: it samples from the product of marginals instead of the joint ``p(x_J | x_t)``. The gap is the
conditional total correlation ``TC = E_{x_t} KL(p(x_J | x_t) || prod_j p(x_j | x_t))``.

Estimator (see ``docs/analysis.md``). States ``x_t`` are the teacher's own intermediate states, rebuilt from a
trajectory dataset (:mod:`t3d_trl.data.schema`): inside decoding block ``b`` of a completion, every earlier
block is clean, the block's tokens that the teacher unmasked first are clean, the other ``t`` are masked, and
later blocks are masked (the canvas of ``diffusion_generate``). ``t`` counts the block's masked tokens, so the
paper's time runs down to ``s = 0``, the clean block. The jump ``t -> s`` unmasks the ``t - s`` positions
``J`` that the teacher unmasked next, in the teacher's order (ties by position). For a state:

* the joint ``p(x_J | x_t)`` is the model's one-token-per-step ancestral decoding of ``J`` in that order at
  temperature 1; its log-probability is the sum of the sequential conditionals;
* the product is the one-shot marginals of a single forward at ``x_t``;
* ``log p_joint(x_J) - sum_j log p(x_j | x_t)`` with ``x_J`` drawn from the joint is an unbiased estimate of
  ``KL(joint || product)``; it is averaged over ``num_samples`` draws per state and then over states.

One chain decoding all ``t`` masked tokens of a block gives every jump from ``x_t`` at once (its first ``d``
draws are a draw of the jump to ``s = t - d``), so a block of ``B`` tokens costs ``B (B + 1) / 2`` forward
passes per draw, batched over draws and states. A jump of one token has TC exactly 0 (its joint IS the
marginal). The first forward at each state also gives the mean predictive entropy over the block's masked
positions, reported against the mask ratio ``t / (tokens of the block)``.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data.preparation import check_trajectory_metadata
from ..data.schema import TrajectoryMetadata
from ..diffusion.forward import checked_vocab_size
from ..generation.sampler import BlockRunner, Canvas, layout_canvas
from ..models.forward import unwrap_model


@dataclass
class TotalCorrelationConfig:
    """How :func:`total_correlation` estimates.

    Args:
        num_samples: draws from the joint per state (``K``).
        max_states: analyse at most this many states ``x_t``. States come a whole block at a time (every ``t``
            of a block), blocks drawn at random (seeded) from all complete blocks of all rows; ``None``: all.
        batch_size: sequences per forward pass (draws x states); at least ``num_samples``, as one state's draws
            share a pass.
        seed: seeds the choice of blocks and the draws.
    """

    num_samples: int = 32
    max_states: int | None = 512
    batch_size: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_samples", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_states is not None and self.max_states < 1:
            raise ValueError(f"max_states must be positive or None, got {self.max_states}")
        if self.batch_size < self.num_samples:  # one state's draws share a pass
            raise ValueError(
                f"batch_size ({self.batch_size}) must be at least num_samples ({self.num_samples}): one state's "
                "draws go through one forward pass"
            )


@dataclass
class TotalCorrelationResult:
    """TC over decoding intervals and entropy against mask ratio, JSON-able with :meth:`to_dict`.

    Attributes:
        block_length: decoding block length of the trajectories.
        num_samples: draws per state.
        num_states: states ``x_t`` analysed; ``num_blocks``: the blocks they came from.
        grid: one entry per interval: ``t`` (masked tokens of the block at ``x_t``), ``s`` (after the jump),
            ``jump`` (``t - s``), ``tc`` (nats), ``stderr``, ``states``.
        by_jump: TC against jump size, averaged over ``t``: ``jump``, ``tc``, ``stderr`` and ``blocks`` (a block's
            states share one value, so the standard error is taken over blocks).
        entropy: mean predictive entropy (nats) of the masked positions of the block at ``x_t``, by
            ``mask_ratio``: ``mask_ratio``, ``entropy``, ``stderr``, ``states``.
    """

    block_length: int
    num_samples: int
    num_states: int
    num_blocks: int
    grid: list[dict[str, Any]] = field(default_factory=list)
    by_jump: list[dict[str, Any]] = field(default_factory=list)
    entropy: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``json.dump``; an undefined standard error (one state, one draw) becomes ``None``."""
        data = asdict(self)
        for entries in (data["grid"], data["by_jump"], data["entropy"]):
            for entry in entries:
                entry.update({k: None for k, v in entry.items() if isinstance(v, float) and math.isnan(v)})
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TotalCorrelationResult:
        return cls(**data)

    def tc(self, t: int, s: int) -> float:
        """The TC estimate of the interval ``t -> s`` (``nan`` when no state had ``t`` masked tokens)."""
        for cell in self.grid:
            if (cell["t"], cell["s"]) == (t, s):
                return cell["tc"]
        return math.nan

    def matrix(self) -> np.ndarray:
        """``[block_length + 1, block_length + 1]`` array of TC indexed ``[s, t]``; ``nan`` outside ``s < t``."""
        out = np.full((self.block_length + 1, self.block_length + 1), np.nan)
        for cell in self.grid:
            out[cell["s"], cell["t"]] = cell["tc"]
        return out


@dataclass
class _Block:
    """One complete decoding block of one row: where its tokens sit and the teacher's order over them."""

    row: int
    block: int  # index into the canvas blocks
    order: list[int]  # canvas columns of the block's completion tokens, in the teacher's decoding order
    tokens: list[int]  # the teacher's token at each of those columns


def _mean_stderr(values: Sequence[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=np.float64)
    if len(array) < 2:
        return float(array.mean()), math.nan
    return float(array.mean()), float(array.std(ddof=1) / math.sqrt(len(array)))


def _block_span(metadata: TrajectoryMetadata, prompt_len: int, block: int) -> range:
    """Completion positions that decoding block ``block`` (0 = the first holding a completion token) covers."""
    offset = metadata.block_offset(prompt_len)
    lo = max(block * metadata.block_length - offset, 0)
    return range(lo, min((block + 1) * metadata.block_length - offset, metadata.max_new_tokens))


def _complete_blocks(metadata: TrajectoryMetadata, prompt_len: int, completion_len: int) -> list[int]:
    """Blocks whose every generated position holds a completion token (not the block of an early EOS)."""
    blocks, block = [], 0
    while len(span := _block_span(metadata, prompt_len, block)) and span[-1] < completion_len:
        blocks.append(block)
        block += 1
    return blocks


def _select(
    trajectories: Any, metadata: TrajectoryMetadata, max_states: int | None, seed: int
) -> list[tuple[int, int]]:
    """``(row, block)`` pairs to analyse: every complete block, or a seeded random subset of ``max_states`` states."""
    if hasattr(trajectories, "column_names"):  # a datasets.Dataset: read two columns, not every row
        prompts, completions = trajectories["prompt_ids"], trajectories["completion_ids"]
    else:
        prompts = [row["prompt_ids"] for row in trajectories]
        completions = [row["completion_ids"] for row in trajectories]
    candidates = [
        (i, block)
        for i, (prompt, completion) in enumerate(zip(prompts, completions))
        for block in _complete_blocks(metadata, len(prompt), len(completion))
    ]
    if max_states is None:
        return candidates
    random.Random(seed).shuffle(candidates)
    chosen, states = [], 0
    for i, block in candidates:
        if states >= max_states:
            break
        chosen.append((i, block))
        states += len(_block_span(metadata, len(prompts[i]), block))
    return sorted(chosen)


def _prepare(
    rows: Sequence[Mapping[str, Any]],
    pairs: Sequence[tuple[int, int]],
    metadata: TrajectoryMetadata,
    diffusion: Any,
    pad_id: int,
) -> tuple[Canvas, list[_Block]]:
    """Lay out the rows' canvases like ``diffusion_generate``, clean completions written in, and their blocks.

    ``pairs`` holds ``(index into rows, block)``. Positions after a completion stay masked.
    """
    prompts = [list(row["prompt_ids"]) for row in rows]
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        valid[i, width - len(prompt) :] = True
    canvas = layout_canvas(
        input_ids, valid, diffusion, metadata.block_length, metadata.max_new_tokens, pad_id
    )
    for i, row in enumerate(rows):
        completion, steps = list(row["completion_ids"]), list(row["decode_step"])
        if len(completion) != len(steps) or len(completion) > metadata.max_new_tokens:
            raise ValueError(
                f"row id={row.get('id')!r} has {len(completion)} completion tokens and {len(steps)} decode steps; "
                f"expected equal lengths of at most max_new_tokens={metadata.max_new_tokens}"
            )
        canvas.tokens[i, canvas.gen_index[i, : len(completion)]] = torch.tensor(completion, dtype=torch.long)
    blocks = []
    for i, block in pairs:
        completion, steps = rows[i]["completion_ids"], rows[i]["decode_step"]
        ordered = sorted(_block_span(metadata, len(prompts[i]), block), key=lambda g: (steps[g], g))
        columns = canvas.gen_index[i, ordered].tolist()
        blocks.append(_Block(i, block, columns, [completion[g] for g in ordered]))
    return canvas, blocks


def _states(
    canvas: Canvas, blocks: Sequence[_Block], mask_id: int
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Canvases of every state ``x_t`` of ``blocks``; returns ``[M, L]`` tokens and ``(block index, t)`` per state.

    State ``t`` of a block keeps earlier blocks and the teacher's first ``n - t`` tokens of the block clean and
    masks the block's other ``t`` tokens and every later generated position.
    """
    tokens, index = [], []
    for k, block in enumerate(blocks):
        base = canvas.tokens[block.row].clone()
        columns = canvas.gen_index[block.row]
        base[columns[columns >= min(block.order)]] = mask_id
        n = len(block.order)
        for t in range(n, 0, -1):
            state = base.clone()
            state[block.order[: n - t]] = torch.tensor(block.tokens[: n - t], dtype=torch.long)
            tokens.append(state)
            index.append((k, t))
    return torch.stack(tokens), index


def _block_log_probs(
    model: Any, diffusion: Any, canvas: Canvas, rows: torch.Tensor, tokens: torch.Tensor, block: int
) -> torch.Tensor:
    """Float32 log-probabilities ``[N, block_length, V]`` of block ``block`` for canvases ``tokens`` of ``rows``.

    The mask token is excluded (a decoder that committed it would leave the position masked).
    """
    sub = Canvas(
        tokens,
        canvas.valid[rows],
        canvas.position_ids[rows],
        canvas.gen_index[rows],
        canvas.blocks,
        canvas.prefix,
    )
    start, end = canvas.blocks[block]
    logits = BlockRunner(model, diffusion, sub, use_cache=False).block_logits(tokens, start, end).float()
    logits[..., diffusion.mask_token_id] = float("-inf")
    return logits.log_softmax(-1)


def _run_chains(
    model: Any,
    diffusion: Any,
    canvas: Canvas,
    block: int,
    rows: torch.Tensor,
    tokens0: torch.Tensor,
    chain: torch.Tensor,
    lengths: torch.Tensor,
    num_samples: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode every state's chain ``num_samples`` times, one token per step, and score each prefix.

    Args:
        rows: ``[C]`` canvas row of each state; ``tokens0``: ``[C, L]`` the states.
        chain: ``[C, W]`` positions inside the block, in decoding order (the first ``lengths[c]`` are used).

    Returns:
        ``D`` values ``[C, num_samples, W]`` (entry ``d - 1``: log joint minus log product of the first ``d``
        draws, float64) and the mean predictive entropy ``[C]`` over each state's masked positions.
    """
    device = tokens0.device
    start = canvas.blocks[block][0]
    logp0 = _block_log_probs(model, diffusion, canvas, rows, tokens0, block)  # [C, B, V]
    width = chain.shape[1]
    marginals = logp0.gather(1, chain.unsqueeze(-1).expand(-1, -1, logp0.shape[-1]))
    in_chain = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    entropy = (torch.special.entr(marginals.exp()).sum(-1) * in_chain).sum(-1) / lengths
    # Draw j of state c is row c * num_samples + j.
    owner = torch.arange(len(rows), device=device).repeat_interleave(num_samples)
    tokens = tokens0.repeat_interleave(num_samples, 0)
    joint = torch.zeros(len(owner), dtype=torch.float64, device=device)
    product = torch.zeros_like(joint)
    values = torch.zeros((len(owner), width), dtype=torch.float64, device=device)
    for step in range(width):
        active = (lengths[owner] > step).nonzero().squeeze(1)
        position = chain[owner[active], step]
        if step == 0:
            logp = logp0[owner[active], position]  # the first conditional is the marginal itself
        else:
            logp = _block_log_probs(model, diffusion, canvas, rows[owner[active]], tokens[active], block)
            logp = logp[torch.arange(len(active), device=device), position]
        draw = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
        joint[active] += logp.gather(1, draw.unsqueeze(1)).squeeze(1).double()
        product[active] += logp0[owner[active], position, draw].double()
        values[active, step] = joint[active] - product[active]
        tokens[active, start + position] = draw
    return values.view(len(rows), num_samples, width), entropy


def check_model_matches(model: Any, metadata: TrajectoryMetadata) -> None:
    """Refuse a model whose attention, vocabulary or mask token differs from those the trajectories were decoded
    with: its estimates would score another tokenizer's ids."""
    inner = unwrap_model(model)
    diffusion = inner.diffusion_config
    if diffusion.attention != metadata.attention:
        raise ValueError(
            f"the model (attention={diffusion.attention!r}) does not match the trajectories "
            f"(attention={metadata.attention!r})"
        )
    check_trajectory_metadata(metadata, diffusion, checked_vocab_size(inner, diffusion))


@torch.no_grad()
def total_correlation(
    model: Any,
    trajectories: Any,
    metadata: TrajectoryMetadata | None = None,
    config: TotalCorrelationConfig | None = None,
    progress: bool = True,
) -> TotalCorrelationResult:
    """Estimate the conditional total correlation of ``model`` over the decoding intervals of a block.

    Args:
        model: a model with ``diffusion_generate`` (any :class:`t3d_trl.DiffusionGenerationMixin` model, or a
            ``peft`` model wrapping one), in eval mode.
        trajectories: teacher trajectories: a ``datasets.Dataset`` from :func:`t3d_trl.load_trajectories` or
            a sequence of rows with ``prompt_ids``, ``completion_ids`` and ``decode_step``.
        metadata: how they were decoded; default: the metadata attached to the dataset.
        config: estimation settings.
        progress: show a progress bar.

    Returns:
        A :class:`TotalCorrelationResult` (TC in nats with standard errors, and entropy against mask ratio).
    """
    config = config or TotalCorrelationConfig()
    model = unwrap_model(model)  # a PeftModel's adapters live in its base model's modules
    if metadata is None:
        metadata = TrajectoryMetadata.from_dataset(trajectories)
        if metadata is None:
            raise ValueError("pass metadata=TrajectoryMetadata(...): the trajectories carry none")
    check_model_matches(model, metadata)
    diffusion = model.diffusion_config
    if len(trajectories) == 0:
        raise ValueError("no trajectories to analyse")
    pairs = _select(trajectories, metadata, config.max_states, config.seed)
    if not pairs:
        raise ValueError(
            "no complete decoding block in the trajectories (every completion ends inside its first block)"
        )
    used = sorted({i for i, _ in pairs})
    rows = [trajectories[i] for i in used]
    local = {i: r for r, i in enumerate(used)}
    pad_id = getattr(model.config, "pad_token_id", None)
    pad_id = pad_id if pad_id is not None else (metadata.eos_token_ids or [0])[0]
    canvas, blocks = _prepare(rows, [(local[i], b) for i, b in pairs], metadata, diffusion, pad_id)
    device = next(model.parameters()).device
    canvas = Canvas(
        canvas.tokens.to(device),
        canvas.valid.to(device),
        canvas.position_ids.to(device),
        canvas.gen_index.to(device),
        canvas.blocks,
        canvas.prefix,
    )
    generator = torch.Generator(device=device).manual_seed(config.seed)
    K = config.num_samples
    # Per state: mean over draws of the TC of each jump (cumulative sums along the chain), their spread
    # over draws, and the entropy of the state's one-shot predictions.
    tc_mean: dict[tuple[int, int], np.ndarray] = {}
    tc_std: dict[tuple[int, int], np.ndarray] = {}
    entropy: dict[tuple[int, int], float] = {}
    by_block: dict[int, list[int]] = defaultdict(list)
    for k, block in enumerate(blocks):
        by_block[block.block].append(k)
    num_states = sum(len(b.order) for b in blocks)
    bar = tqdm(total=num_states, desc="total correlation", unit="state", disable=not progress)
    for block_id, members in by_block.items():
        group = [blocks[k] for k in members]
        states, index = _states(canvas, group, diffusion.mask_token_id)
        start = canvas.blocks[block_id][0]
        per_chunk = max(1, config.batch_size // K)
        for lo in range(0, len(index), per_chunk):
            chunk = index[lo : lo + per_chunk]
            rows_idx = torch.tensor([group[k].row for k, _ in chunk], device=device)
            lengths = torch.tensor([t for _, t in chunk], device=device)
            # Chain positions (inside the block) of each state: its masked tokens in the teacher's order.
            chain = torch.zeros((len(chunk), int(lengths.max())), dtype=torch.long)
            for c, (k, t) in enumerate(chunk):
                chain[c, :t] = torch.tensor(group[k].order[len(group[k].order) - t :]) - start
            tokens0 = states[lo : lo + per_chunk].to(device)
            values, ent = _run_chains(
                model, diffusion, canvas, block_id, rows_idx, tokens0, chain.to(device), lengths, K, generator
            )
            values = values.cpu().numpy()
            for c, (k, t) in enumerate(chunk):
                key = (members[k], t)
                tc_mean[key] = values[c, :, :t].mean(0)
                tc_std[key] = values[c, :, :t].std(0, ddof=1) if K > 1 else np.full(t, np.nan)
                entropy[key] = float(ent[c])
            bar.update(len(chunk))
    bar.close()
    return _summarise(blocks, tc_mean, tc_std, entropy, metadata.block_length, K)


def _summarise(
    blocks: Sequence[_Block],
    tc_mean: Mapping[tuple[int, int], np.ndarray],
    tc_std: Mapping[tuple[int, int], np.ndarray],
    entropy: Mapping[tuple[int, int], float],
    block_length: int,
    num_samples: int,
) -> TotalCorrelationResult:
    cells: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    jumps: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    ratios: dict[float, list[float]] = defaultdict(list)
    for (k, t), means in tc_mean.items():
        for jump in range(1, t + 1):
            cells[(t, t - jump)].append((float(means[jump - 1]), float(tc_std[(k, t)][jump - 1])))
            jumps[jump][k].append(float(means[jump - 1]))
        ratios[round(t / len(blocks[k].order), 6)].append(entropy[(k, t)])
    grid = []
    for (t, s), entries in sorted(cells.items()):
        tc, stderr = _mean_stderr([m for m, _ in entries])
        if len(entries) == 1:  # one state: the spread over its draws is all there is
            stderr = entries[0][1] / math.sqrt(num_samples)
        grid.append({"t": t, "s": s, "jump": t - s, "tc": tc, "stderr": stderr, "states": len(entries)})
    by_jump = []
    for jump, per_block in sorted(jumps.items()):
        tc, stderr = _mean_stderr([float(np.mean(v)) for v in per_block.values()])
        by_jump.append({"jump": jump, "tc": tc, "stderr": stderr, "blocks": len(per_block)})
    curve = []
    for ratio, values in sorted(ratios.items()):
        mean, stderr = _mean_stderr(values)
        curve.append({"mask_ratio": ratio, "entropy": mean, "stderr": stderr, "states": len(values)})
    return TotalCorrelationResult(
        block_length=block_length,
        num_samples=num_samples,
        num_states=len(tc_mean),
        num_blocks=len(blocks),
        grid=grid,
        by_jump=by_jump,
        entropy=curve,
    )
