"""Turn trajectory rows into training inputs: intermediate states ``x_t`` laid out for the model's attention.

States. A teacher trajectory records, for every completion token, the global step at which the teacher unmasked
it (``decode_step``). The teacher's real intermediate state after step ``t`` is the clean completion with every
token whose ``decode_step`` is later than ``t`` replaced by the mask token (:func:`teacher_state`). The collator
draws ``t`` among the steps the teacher actually ran (a state with at least one masked token):

* ``uniform`` (default): every teacher denoising step is equally likely.
* ``reference``: a state is drawn with probability proportional to ``r ** 8``, ``r`` the share of its block still
  masked (the public reference code's choice: with 4 steps per block, 0.906 / 0.091 / 0.0035 / 0.00001 for 4, 3,
  2, 1 masks). Unlike that code, the masked tokens are always the LATEST-decoded ones, so the state is real.

The baselines use other states: ``random`` masks each completion token with probability ``t ~ U(0, 1]`` (ReDi,
MDLM) and ``semi_ar`` keeps the blocks before a random block clean, masks that block randomly and every later
block fully (dParallel). Every row always has at least one masked token; random states are drawn from the
exact conditional distribution given that, and ``mask_prob`` is each position's masking probability under it, so
the MDLM loss weighted by ``1 / mask_prob`` stays an unbiased ELBO with bounded weights.

Layouts. Blocks follow the sampler: for bidirectional models they start at the end of the prompt; for
block-causal models they are aligned to absolute position 0, so the prompt's tail shares the first block.

* bidirectional: ``[left-padded prompt | x_t | right padding]``; one state per row, later blocks fully masked.
* block-causal: ``[left-padded prompt | clean completion | noisy blocks]`` (block diffusion training). Each
  noisy block sees the prompt, the clean blocks before it and itself, and reuses the clean copy's position ids,
  so every noisy block is an exact teacher state: the teacher decodes a block with all earlier blocks complete.
  Each block carries its own state (one forward pass trains on one state per block).

Random-token mixing (paper, appendix "Mixture of Random Tokens") replaces each masked input position with a
uniformly drawn token with probability ``random_token_prob``; the targets stay the clean tokens.

Noise is drawn from a generator keyed on ``(seed, epoch, row)``, so a row gets the same state whatever the batch
size, the number of processes or the data order, and a new one every epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from ..diffusion.config import DiffusionConfig, block_offset
from ..diffusion.masks import additive_mask, padding_attention_mask, position_ids_from_valid
from ..generation.configuration import SCHEDULES
from ..generation.remasking import transfer_schedule

STATE_KINDS = ("trajectory", "random", "semi_ar")
STATE_SAMPLING = ("uniform", "reference")
_REFERENCE_POWER = 8


def teacher_state(
    completion_ids: torch.Tensor, decode_step: torch.Tensor, step: int, mask_token_id: int
) -> torch.Tensor:
    """The teacher's intermediate state after global step ``step``: tokens decoded later are masked."""
    return torch.where(decode_step > step, torch.full_like(completion_ids, mask_token_id), completion_ids)


@dataclass
class DataCollatorForDiffusion:
    """Collate rows ``{prompt_ids, completion_ids[, decode_step][, row_index]}`` into a diffusion training batch.

    A row may also bring its own noise, ``masked`` (bool per completion token) and ``mask_prob`` (the weight of a
    masked token is ``1 / mask_prob``), which then replace ``states``.

    Args:
        diffusion: the student's diffusion description (mask token, attention kind).
        block_length: decoding block length of the trajectories (the teacher's).
        pad_token_id: id written in padding positions (never attended).
        states: ``trajectory`` (from ``decode_step``), ``random`` or ``semi_ar`` (see the module docstring).
        state_sampling: ``uniform`` or ``reference``; how a trajectory state is drawn.
        random_token_prob: probability of showing a uniform random token instead of the mask token.
        vocab_size: vocabulary the random tokens are drawn from (needed when ``random_token_prob > 0``).
        tokens_per_step: the student's tokens per step, to express each token's decoding order in student steps
            (``path_step``, the ``pi_i`` of the path-consistency loss).
        schedule: how the student's sampler splits a block over its steps (``DiffusionGenerationConfig.schedule``:
            ``llada``, ``sdar`` or ``dream``), so that ``path_step`` counts the steps the student really takes.
        seed: base seed of the per-row noise.
        epoch: current epoch (the trainer advances it), so each epoch draws new states.

    The batch holds ``input_ids``, ``position_ids``, ``valid`` (real, non-padding positions), ``noisy`` (the
    noisy copy of a block-causal layout), ``keep`` (the 1-D columns whose predictions are needed) and, at those
    columns, ``targets``, ``target_mask`` (completion tokens), ``loss_mask`` (the masked positions of ``x_t``),
    ``path_step`` and ``mask_prob`` (the masking probability of random states). Build the attention mask with
    :func:`diffusion_attention_mask`.
    """

    diffusion: DiffusionConfig
    block_length: int
    pad_token_id: int
    states: Literal["trajectory", "random", "semi_ar"] = "trajectory"
    state_sampling: Literal["uniform", "reference"] = "uniform"
    random_token_prob: float = 0.0
    vocab_size: int | None = None
    tokens_per_step: int = 1
    schedule: Literal["llada", "sdar", "dream"] = "llada"
    seed: int = 0
    epoch: int = 0

    def __post_init__(self) -> None:
        if self.block_length < 1:
            raise ValueError(f"block_length must be positive, got {self.block_length}")
        if self.states not in STATE_KINDS:
            raise ValueError(f"states must be one of {STATE_KINDS}, got {self.states!r}")
        if self.state_sampling not in STATE_SAMPLING:
            raise ValueError(f"state_sampling must be one of {STATE_SAMPLING}, got {self.state_sampling!r}")
        if not 0 <= self.random_token_prob < 1:
            raise ValueError(f"random_token_prob must be in [0, 1), got {self.random_token_prob}")
        if self.random_token_prob > 0 and (self.vocab_size is None or self.vocab_size < 2):
            raise ValueError(f"random_token_prob > 0 needs vocab_size (at least 2), got {self.vocab_size!r}")
        if self.tokens_per_step < 1:
            raise ValueError(f"tokens_per_step must be positive, got {self.tokens_per_step}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.diffusion.is_block_causal and self.diffusion.shift_logits:
            raise ValueError("block-causal training with shifted logits (Dream-style) is not supported")

    # ---- per-row noise -------------------------------------------------------------------------------------

    def _rng(self, example: dict[str, Any]) -> np.random.Generator:
        row = example.get("row_index")
        if row is None:  # no index column: key on the content (deterministic across processes)
            row = hash((tuple(example["prompt_ids"]), tuple(example["completion_ids"]))) & 0x7FFFFFFF
        return np.random.default_rng([self.seed & 0xFFFFFFFF, self.epoch, int(row)])

    def _blocks(self, prompt_len: int, completion_len: int) -> np.ndarray:
        offset = block_offset(prompt_len, self.block_length, self.diffusion.is_block_causal)
        return (offset + np.arange(completion_len)) // self.block_length

    def _trajectory_mask(
        self, steps: np.ndarray, groups: np.ndarray, blocks: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        """Per group, the teacher state before one of its denoising steps: mask tokens decoded at or after it.

        ``reference`` weights a state by the share of ITS BLOCK still masked (the block the step decodes in),
        also on a bidirectional canvas where one group spans every block.
        """
        if steps.size and steps.min() < 1:
            raise ValueError(
                f"decode_step entries must be >= 1 (global 1-based steps), got {int(steps.min())}"
            )
        span = int(steps.max()) + 1
        keys, inverse = np.unique(groups * span + steps, return_inverse=True)
        cand_group, cand_step = keys // span, keys % span  # sorted by group, then step
        if self.state_sampling == "uniform":
            weights = np.ones(len(keys))
        else:
            # The teacher decodes block by block, so all tokens of one step share a block.
            cand_block = np.zeros(len(keys), dtype=np.int64)
            cand_block[inverse] = blocks
            same_block = (groups[None, :] == cand_group[:, None]) & (blocks[None, :] == cand_block[:, None])
            block_tokens = same_block.sum(1)
            decoded_before = (same_block & (steps[None, :] < cand_step[:, None])).sum(1)
            weights = (1.0 - decoded_before / block_tokens) ** _REFERENCE_POWER
        cum_w = np.cumsum(weights)
        group_start = np.searchsorted(cand_group, np.arange(groups.max() + 1), side="left")
        group_end = np.searchsorted(cand_group, np.arange(groups.max() + 1), side="right")
        base = cum_w[group_start] - weights[group_start]
        total = cum_w[group_end - 1] - base
        chosen = np.searchsorted(cum_w, base + rng.random(len(group_start)) * total, side="right")
        chosen = np.clip(chosen, group_start, group_end - 1)
        threshold = cand_step[chosen]
        return steps >= threshold[groups]

    def _random_mask(self, groups: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Per group, ``t ~ U(0, 1]`` and each token masked with probability ``t``, conditioned on at least one mask.

        A group that drew no mask is redrawn exactly from that conditional (a truncated binomial count, then that
        many positions), not by forcing one token: forcing makes a lone mask at tiny ``t`` carry the MDLM weight
        ``1/t``, an estimator of unbounded variance. Returns the mask and each position's masking probability
        under the conditional, ``t / (1 - (1 - t) ** n)`` for a group of ``n`` tokens, so that weighting by its
        inverse keeps the MDLM objective unbiased, with every weight at most ``n``.
        """
        num_groups = int(groups.max()) + 1
        sizes = np.bincount(groups, minlength=num_groups)
        t = 1.0 - rng.random(num_groups)
        masked = rng.random(len(groups)) < t[groups]
        for g in np.flatnonzero(np.bincount(groups, weights=masked, minlength=num_groups) == 0):
            k = np.arange(1, sizes[g] + 1)
            # log P(k) - log P(0) of Binomial(n, t), accumulated as a product of successive ratios.
            log_ratio = np.cumsum(np.log(sizes[g] - k + 1) - np.log(k) + np.log(t[g]) - np.log1p(-t[g]))
            probs = np.exp(log_ratio - log_ratio.max())
            count = rng.choice(k, p=probs / probs.sum())
            masked[rng.choice(np.flatnonzero(groups == g), size=count, replace=False)] = True
        any_mask = -np.expm1(sizes * np.log1p(-np.minimum(t, 1.0 - 1e-12)))
        return masked, np.minimum(t / any_mask, 1.0)[groups]

    def _path_step(self, steps: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """The student step (1-based, within its block) at which each token is decoded: its rank in the block's
        decoding order mapped through the per-block quota of the student's sampler (:func:`transfer_schedule`
        with the student's ``schedule``), so that a partial block (the first block of a block-causal model after
        a prompt tail) is split over the ``block_length / tokens_per_step`` steps as the sampler splits it.

        A last block cut at EOS counts only its kept tokens (the trajectory has no others), so they are spread
        over the block's steps: an approximation, since the sampler decoded the whole block, EOS tail included.
        """
        length = len(steps)
        order = np.lexsort((np.arange(length), steps, blocks))
        rank = np.empty(length, dtype=np.int64)
        rank[order] = np.arange(length) - np.searchsorted(blocks[order], blocks[order], side="left")
        steps_per_block = max(1, self.block_length // self.tokens_per_step)
        block_tokens = torch.from_numpy(np.bincount(blocks))
        quota = transfer_schedule(block_tokens, steps_per_block, self.schedule, self.block_length)
        done = quota.cumsum(1).numpy()  # tokens decoded by step j
        return (done[blocks] <= rank[:, None]).sum(1) + 1

    def _row_state(self, example: dict[str, Any]) -> dict[str, np.ndarray]:
        prompt = np.asarray(example["prompt_ids"], dtype=np.int64)
        completion = np.asarray(example["completion_ids"], dtype=np.int64)
        length = len(completion)
        if length == 0:
            raise ValueError(f"row {example.get('id', example.get('row_index'))!r} has an empty completion")
        rng = self._rng(example)
        blocks = self._blocks(len(prompt), length)
        groups = blocks if self.diffusion.is_block_causal else np.zeros(length, dtype=np.int64)
        prob = np.ones(length)
        path_step = np.zeros(length, dtype=np.int64)
        if example.get("masked") is not None:  # the caller's own noise (the lm-eval likelihood estimator)
            masked = np.asarray(example["masked"], dtype=bool)
            prob = np.asarray(example["mask_prob"], dtype=np.float64)
        elif self.states == "trajectory":
            steps = example.get("decode_step")
            if steps is None:
                raise ValueError("trajectory states need a decode_step column (the teacher's decoding order)")
            steps = np.asarray(steps, dtype=np.int64)
            if steps.shape != completion.shape:
                raise ValueError(
                    f"row {example.get('id', example.get('row_index'))!r}: {len(steps)} decode_step entries for "
                    f"{length} completion tokens"
                )
            masked = self._trajectory_mask(steps, groups, blocks, rng)
            path_step = self._path_step(steps, blocks)
        elif self.states == "random" or self.diffusion.is_block_causal:
            masked, prob = self._random_mask(groups, rng)
        else:  # semi_ar on a bidirectional canvas: earlier blocks clean, a random block noised, later ones masked
            current = int(rng.integers(blocks.max() + 1))
            in_block = blocks == current
            masked = blocks > current
            masked[in_block], prob[in_block] = self._random_mask(
                np.zeros(int(in_block.sum()), dtype=np.int64), rng
            )
        noisy = np.where(masked, self.diffusion.mask_token_id, completion)
        if self.random_token_prob > 0:
            swap = masked & (rng.random(length) < self.random_token_prob)
            draw = rng.integers(0, self.vocab_size - 1, size=length)
            draw = draw + (draw >= self.diffusion.mask_token_id)  # never the mask token itself
            noisy = np.where(swap, draw, noisy)
        return {
            "prompt": prompt,
            "completion": completion,
            "noisy": noisy,
            "masked": masked,
            "prob": prob,
            "path_step": path_step,
        }

    # ---- layout ----------------------------------------------------------------------------------------------

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        rows = [self._row_state(example) for example in examples]
        batch = len(rows)
        block_causal = self.diffusion.is_block_causal
        prompt_width = max(len(r["prompt"]) for r in rows)
        completion_width = max(len(r["completion"]) for r in rows)
        tails = [block_offset(len(r["prompt"]), self.block_length, block_causal) for r in rows]
        noisy_width = max(t + len(r["completion"]) for t, r in zip(tails, rows)) if block_causal else 0
        width = prompt_width + completion_width + noisy_width
        keep_start = prompt_width + completion_width if block_causal else prompt_width
        keep_width = width - keep_start

        input_ids = np.full((batch, width), self.pad_token_id, dtype=np.int64)
        position_ids = np.zeros((batch, width), dtype=np.int64)
        valid = np.zeros((batch, width), dtype=bool)
        noisy_cols = np.zeros((batch, width), dtype=bool)
        targets = np.full((batch, keep_width), self.pad_token_id, dtype=np.int64)
        target_mask = np.zeros((batch, keep_width), dtype=bool)
        loss_mask = np.zeros((batch, keep_width), dtype=bool)
        path_step = np.zeros((batch, keep_width), dtype=np.int64)
        mask_prob = np.ones((batch, keep_width), dtype=np.float32)

        for i, (row, tail) in enumerate(zip(rows, tails)):
            p, c = len(row["prompt"]), len(row["completion"])
            input_ids[i, prompt_width - p : prompt_width] = row["prompt"]
            valid[i, prompt_width - p : prompt_width + c] = True
            position_ids[i, prompt_width - p : prompt_width + c] = np.arange(p + c)
            if block_causal:
                input_ids[i, prompt_width : prompt_width + c] = row["completion"]
                start = keep_start
                region = np.concatenate([row["prompt"][p - tail :], row["noisy"]])
                input_ids[i, start : start + tail + c] = region
                position_ids[i, start : start + tail + c] = np.arange(p - tail, p + c)
                valid[i, start : start + tail + c] = True
                noisy_cols[i, start : start + tail + c] = True
            else:
                input_ids[i, prompt_width : prompt_width + c] = row["noisy"]
            cols = slice(tail, tail + c)
            targets[i, cols] = row["completion"]
            target_mask[i, cols] = True
            loss_mask[i, cols] = row["masked"]
            path_step[i, cols] = row["path_step"]
            mask_prob[i, cols] = row["prob"]

        out = {
            "input_ids": torch.from_numpy(input_ids),
            "position_ids": torch.from_numpy(position_ids),
            "valid": torch.from_numpy(valid),
            "noisy": torch.from_numpy(noisy_cols),
            "keep": torch.arange(keep_start, width),
            "targets": torch.from_numpy(targets),
            "target_mask": torch.from_numpy(target_mask),
            "loss_mask": torch.from_numpy(loss_mask),
            "path_step": torch.from_numpy(path_step),
            "mask_prob": torch.from_numpy(mask_prob),
        }
        if not block_causal:
            # Positions counted over real tokens (left padding gets 0), exactly like the sampler.
            out["position_ids"] = position_ids_from_valid(out["valid"])
        return out


def diffusion_attention_mask(
    batch: dict[str, torch.Tensor],
    block_length: int,
    block_causal: bool,
    dtype: torch.dtype,
    for_decoder: bool,
) -> torch.Tensor:
    """The attention mask of a :class:`DataCollatorForDiffusion` batch.

    Decoders get an additive float mask ``[B, 1, T, T]``; encoder MLMs (bidirectional only) a ``[B, T]`` 0/1 mask.
    Block-causal layouts: a clean position sees valid clean positions of its own and earlier blocks; a noisy
    position sees clean positions of earlier blocks and the noisy positions of its own block.
    """
    valid = batch["valid"]
    if not block_causal:
        if not for_decoder:
            return valid.long()
        return padding_attention_mask(valid, valid.shape[1], dtype)
    if not for_decoder:
        raise ValueError("block-causal training needs a decoder that takes 4D attention masks")
    block = batch["position_ids"] // block_length
    noisy = batch["noisy"]
    q_block, k_block = block.unsqueeze(2), block.unsqueeze(1)
    q_noisy, k_noisy = noisy.unsqueeze(2), noisy.unsqueeze(1)
    clean_query = ~q_noisy & ~k_noisy & (k_block <= q_block)
    noisy_query = q_noisy & ((~k_noisy & (k_block < q_block)) | (k_noisy & (k_block == q_block)))
    allowed = (clean_query | noisy_query) & valid.unsqueeze(1)
    allowed |= torch.eye(valid.shape[1], dtype=torch.bool, device=valid.device).unsqueeze(0)
    return additive_mask(allowed, dtype)
