"""Student states (``T3DConfig.student_state_ratio``): training states one parallel step of the student off the
teacher's trajectory, relabelled by the frozen teacher.

The labels of the positions still masked in a moved block are either the teacher's per-position argmax at the
student state (``"argmax"``, one teacher forward), or the teacher's own sequential completion of that state
(``"rollout"``, :func:`teacher_rollout`, up to ``block_length`` teacher forwards).

Both the student's step and the teacher's labels run on the state the sampler has, every loss position showing
the mask token: the collator's random tokens (``random_token_prob``) are a training-input noise the sampler never
produces, so they go back into the training input only, at the positions that stay masked.

Which rows move is drawn from a generator keyed on ``(seed, global_step, micro_batch, process)``, and how many
positions leave the loss depends only on the batch (each moving block commits exactly ``tokens_per_step`` of its
masked positions), not on the student's predictions. So the loss's normaliser for the whole accumulated step
(:func:`committed_count`) is known before any state is made, and the states themselves are made in
``training_step``, one micro-batch at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def chosen_rows(num_rows: int, ratio: float, key: int, device: torch.device | str) -> torch.Tensor:
    """The rows (a boolean ``[num_rows]``) that move off the trajectory, drawn from a generator seeded ``key``."""
    generator = torch.Generator().manual_seed(key)
    return (torch.rand(num_rows, generator=generator) < ratio).to(device)


def decoding_blocks(
    batch: dict[str, torch.Tensor], block_length: int, is_block_causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block index of each kept column, the loss positions of the blocks being decoded).

    Block-causal: every noisy block is being decoded; bidirectional: the first block that holds a mask (blocks
    start at the completion, the first kept column; later blocks wait for the current one).
    """
    loss_mask, keep = batch["loss_mask"], batch["keep"]
    if is_block_causal:
        return batch["position_ids"][:, keep] // block_length, loss_mask
    block = torch.arange(keep.numel(), device=keep.device).expand_as(loss_mask) // block_length
    first = torch.where(loss_mask, block, torch.full_like(block, block.max() + 1)).min(-1, keepdim=True)
    return block, loss_mask & (block == first.values)


def _moving_blocks(block: torch.Tensor, loss_mask: torch.Tensor, tokens_per_step: int):
    """``(b, in_block, steps)`` for each block ``b``: its loss positions and whether it moves (a mask is left
    after committing ``tokens_per_step`` tokens)."""
    for b in block.unique().tolist():
        in_block = (block == b) & loss_mask
        yield b, in_block, in_block.sum(-1, keepdim=True) > tokens_per_step


def committed_count(
    batch: dict[str, torch.Tensor],
    chosen: torch.Tensor,
    block_length: int,
    is_block_causal: bool,
    tokens_per_step: int,
) -> torch.Tensor:
    """How many loss positions the student states of ``chosen`` rows commit (they leave the loss)."""
    if not chosen.any():
        return torch.zeros((), dtype=torch.long, device=chosen.device)
    rows = {k: v if k == "keep" else v[chosen.to(v.device)] for k, v in batch.items() if torch.is_tensor(v)}
    block, loss_mask = decoding_blocks(rows, block_length, is_block_causal)
    return sum(
        steps.sum() * tokens_per_step for _, _, steps in _moving_blocks(block, loss_mask, tokens_per_step)
    )


STUDENT_STATE_LABELS = ("argmax", "rollout")


@torch.no_grad()
def teacher_rollout(
    batch: dict[str, torch.Tensor],
    teacher_logits: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    block: torch.Tensor,
    todo: torch.Tensor,
) -> tuple[torch.Tensor, int]:
    """The teacher's own greedy completion of the positions ``todo`` (``[rows, kept]``) of ``batch``, one token
    per step and block, and how many teacher forwards it took.

    Each step runs the teacher on the current state and, in every block (``block``: the block index of each
    kept column) that still holds a ``todo`` position, commits the single most confident one to the teacher's
    argmax there (low-confidence order, as a one-token-per-step sampler decodes); the next step sees it. Blocks
    decode side by side, so a block of ``L`` positions takes at most ``L`` forwards. Positions not yet committed
    show what ``batch`` shows there: :func:`make_student_states` passes the sampler's state, where they show the
    mask token (never the collator's random tokens), as for the argmax labels.

    Why: trajectory self-distillation (the paper's section "Trajectory Self-Distillation") pairs a state with the
    clean tokens of the teacher's own rollout from it, whose tokens are coherent because each conditions on
    the ones committed before it. The per-position argmax of a single forward is the mean-field factorisation
    the paper names as the few-step bottleneck: where the teacher's distribution has several modes (two
    answers), neighbouring positions can take their argmax from different modes and the labels spell neither.
    The rollout's labels are always one completion the teacher itself would write from that state.

    Returns ``(tokens, forwards)``; ``tokens`` holds the committed token at every ``todo`` position (other
    entries are 0). ``batch`` is not modified: the rollout's tokens are labels, never the training input.
    """
    keep = batch["keep"]
    state = dict(batch)
    state["input_ids"] = batch["input_ids"].clone()
    state["loss_mask"] = batch["loss_mask"].clone()
    tokens = torch.zeros(todo.shape, dtype=batch["input_ids"].dtype, device=todo.device)
    left = todo.clone()
    forwards = 0
    while left.any():
        confidence, proposal = teacher_logits(state).float().softmax(-1).max(-1)
        forwards += 1
        commit = torch.zeros_like(left)
        for b in block[left].unique().tolist():
            in_block = left & (block == b)
            best = confidence.masked_fill(~in_block, -1.0).argmax(-1, keepdim=True)
            commit |= torch.zeros_like(left).scatter_(-1, best, True) & in_block
        tokens = torch.where(commit, proposal, tokens)
        state["input_ids"][:, keep] = torch.where(commit, proposal, state["input_ids"][:, keep])
        state["loss_mask"] &= ~commit
        left &= ~commit
    return tokens, forwards


@torch.no_grad()
def make_student_states(
    inputs: dict[str, torch.Tensor],
    chosen: torch.Tensor,
    student_logits: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    teacher_logits: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    block_length: int,
    is_block_causal: bool,
    tokens_per_step: int,
    mask_token_id: int,
    labels: str = "argmax",
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``inputs`` with the ``chosen`` rows moved one student step and relabelled by the teacher, and the moved
    rows' batch (``input_ids``, ``loss_mask``, ``targets``).

    The student commits, and the teacher labels, on the state the sampler would hold: every loss position shows
    ``mask_token_id``, whatever random token the collator put there (T3D's states are the teacher's and the
    student's own decoding states; the random tokens of the paper's "Mixture of Random Tokens" are input noise
    for training only). The returned training input shows the student's proposal at the committed positions and
    the collated input (mask or random token) at the positions still masked.

    ``labels`` (``T3DConfig.student_state_labels``): ``"argmax"``, the teacher's per-position argmax at the
    student state (one forward); ``"rollout"``, the tokens of the teacher's sequential greedy completion of the
    moved blocks (:func:`teacher_rollout`). Either way the input is the student state; only the targets differ.
    """
    if labels not in STUDENT_STATE_LABELS:
        raise ValueError(f"labels must be one of {STUDENT_STATE_LABELS}, got {labels!r}")
    batch = {k: v if k == "keep" else v[chosen] for k, v in inputs.items()}
    keep = batch["keep"]
    shown = batch["input_ids"][:, keep]  # the collated input: random tokens at some masked positions
    masked = torch.where(batch["loss_mask"], torch.full_like(shown, mask_token_id), shown)
    batch["input_ids"] = batch["input_ids"].clone()
    batch["input_ids"][:, keep] = masked
    confidence, proposal = student_logits(batch).float().softmax(-1).max(-1)
    block, loss_mask = decoding_blocks(batch, block_length, is_block_causal)
    score = confidence.masked_fill(~loss_mask, -1.0)
    commit = torch.zeros_like(loss_mask)
    moved = torch.zeros_like(loss_mask)  # blocks whose state moved: only they are relabelled
    positions = torch.arange(score.shape[-1], device=score.device).expand_as(score)
    for b, in_block, steps in _moving_blocks(block, loss_mask, tokens_per_step):
        ranked = score.masked_fill(block != b, -1.0).argsort(-1, descending=True)
        rank = torch.empty_like(ranked).scatter_(-1, ranked, positions)
        commit |= in_block & (rank < tokens_per_step) & steps
        moved |= (block == b) & steps
    batch["input_ids"][:, keep] = torch.where(commit, proposal, masked)
    batch["loss_mask"] = batch["loss_mask"] & ~commit
    relabel = batch["loss_mask"] & moved
    if labels == "rollout":
        teacher, _ = teacher_rollout(batch, teacher_logits, block, relabel)
    else:
        teacher = teacher_logits(batch).argmax(-1)
    batch["targets"] = torch.where(relabel, teacher, batch["targets"])
    # The training input keeps the collated random tokens where the student state is still masked.
    batch["input_ids"][:, keep] = torch.where(commit, proposal, shown)
    out = dict(inputs)
    for name in ("input_ids", "loss_mask", "targets"):
        out[name] = inputs[name].clone()
        out[name][chosen] = batch[name]
    return out, batch
