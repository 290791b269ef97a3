"""Student states' teacher labels on scripted teachers: the rollout is the teacher's own one-token-per-step
greedy completion, not its per-position argmax."""

from __future__ import annotations

import pytest
import torch

from t3d_trl.trainer.student_states import decoding_blocks, make_student_states, teacher_rollout

MASK, X, Y, STUDENT, PROMPT = 0, 1, 2, 3, 4
VOCAB = 5


def probabilities(first: float, first_token: int, second_token: int) -> torch.Tensor:
    """Log-probabilities putting ``first`` on ``first_token`` and the rest (but a trace) on ``second_token``."""
    p = torch.full((VOCAB,), 1e-4)
    p[first_token], p[second_token] = first, 1 - first
    return p.log()


class TwoModeTeacher:
    """A block whose three open positions spell X X X or Y Y Y (two answers), with the logits scripted by hand.

    Undecided (no X or Y committed yet) each position's own marginal: position 1 leans X (0.6), position 2 leans
    Y (0.55), position 3 leans X (0.52), so the per-position argmax is X Y X, neither answer. Once an answer's
    token is committed, every open position follows it, position 3 (0.9) more surely than position 2 (0.8).
    Records the completion columns of every state it is run on.
    """

    def __init__(self):
        self.states: list[list[int]] = []

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        columns = batch["input_ids"][:, batch["keep"]]
        logits = torch.zeros(*columns.shape, VOCAB)
        for row, tokens in enumerate(columns.tolist()):
            self.states.append(tokens)
            decided = [t for t in tokens[1:] if t in (X, Y)]
            if decided:
                mode, other = decided[0], X + Y - decided[0]
                logits[row, 2] = probabilities(0.8, mode, other)
                logits[row, 3] = probabilities(0.9, mode, other)
            else:
                logits[row, 1] = probabilities(0.6, X, Y)
                logits[row, 2] = probabilities(0.55, Y, X)
                logits[row, 3] = probabilities(0.52, X, Y)
        return logits


def student(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A student sure of STUDENT at the first completion position (it commits it), unsure elsewhere."""
    logits = torch.zeros(*batch["loss_mask"].shape, VOCAB)
    logits[:, 0, STUDENT] = 10.0
    return logits


def two_mode_batch() -> dict[str, torch.Tensor]:
    """Two rows: a prompt column and one fully masked block of 4 (the teacher's trajectory wrote X X X X)."""
    return {
        "input_ids": torch.tensor([[PROMPT, MASK, MASK, MASK, MASK]] * 2),
        "position_ids": torch.arange(5).expand(2, 5),
        "keep": torch.arange(1, 5),
        "loss_mask": torch.ones(2, 4, dtype=torch.bool),
        "targets": torch.full((2, 4), X),
    }


def states(labels: str) -> tuple[dict, dict, TwoModeTeacher]:
    teacher = TwoModeTeacher()
    out, moved = make_student_states(
        two_mode_batch(),
        torch.tensor([True, False]),
        student,
        teacher,
        block_length=4,
        is_block_causal=False,
        tokens_per_step=1,
        labels=labels,
    )
    return out, moved, teacher


def test_rollout_labels_are_the_teachers_sequential_completion_not_its_argmax():
    argmax, _, once = states("argmax")
    rollout, _, teacher = states("rollout")
    # The student committed position 0; positions 1-3 are relabelled. One forward mixes the answers.
    assert argmax["targets"][0].tolist() == [X, X, Y, X]
    assert len(once.states) == 1
    # By hand: step 1 commits position 1 (0.6, X); then every open position follows X and position 3 (0.9)
    # goes before position 2 (0.8). Each forward sees the tokens committed before it.
    assert teacher.states == [
        [STUDENT, MASK, MASK, MASK],
        [STUDENT, X, MASK, MASK],
        [STUDENT, X, MASK, X],
    ]
    assert rollout["targets"][0].tolist() == [X, X, X, X]
    assert rollout["targets"][1].tolist() == [X] * 4  # a row that did not move keeps its trajectory labels


def test_labels_change_only_the_targets_not_the_student_state():
    (argmax, argmax_moved, _), (rollout, rollout_moved, _) = states("argmax"), states("rollout")
    for name in ("input_ids", "loss_mask"):
        assert torch.equal(argmax[name], rollout[name])
        assert torch.equal(argmax_moved[name], rollout_moved[name])
    # The training input is the student state: the rollout's tokens never enter it.
    assert rollout["input_ids"][0].tolist() == [PROMPT, STUDENT, MASK, MASK, MASK]
    assert rollout["loss_mask"][0].tolist() == [False, True, True, True]
    assert not torch.equal(argmax["targets"], rollout["targets"])


def test_unknown_labels_are_refused():
    with pytest.raises(ValueError, match="labels must be one of"):
        states("sample")


def random_teacher(calls: list[int], vocab: int = 7):
    """A teacher whose logits depend on the whole state (every token shifts every position's logits)."""
    generator = torch.Generator().manual_seed(0)
    table, bias = torch.randn(vocab, vocab, generator=generator), torch.randn(64, vocab, generator=generator)

    def logits(batch):
        calls.append(1)
        columns = batch["input_ids"][:, batch["keep"]]
        return table[columns].sum(1, keepdim=True) + bias[: columns.shape[1]]

    return logits


@pytest.mark.parametrize("is_block_causal", [True, False])
def test_blocks_roll_out_side_by_side_in_at_most_block_length_forwards(is_block_causal):
    # Three blocks of 4 with 1-4 open positions each: block-causal decodes them together (as many forwards as
    # the fullest block holds, not their sum); bidirectional only the first open block.
    rows, length = 3, 12
    generator = torch.Generator().manual_seed(1)
    batch = {
        "input_ids": torch.randint(1, 7, (rows, length + 2), generator=generator),
        "position_ids": torch.arange(length + 2).expand(rows, -1),
        "keep": torch.arange(2, length + 2),
        "loss_mask": torch.rand(rows, length, generator=generator) < 0.6,
        "targets": torch.zeros(rows, length, dtype=torch.long),
    }
    batch["loss_mask"][:, 8:] = True  # one block fully open
    batch["input_ids"][:, 2:][batch["loss_mask"]] = MASK
    block, todo = decoding_blocks(batch, 4, is_block_causal)
    calls: list[int] = []
    teacher = random_teacher(calls)
    tokens, forwards = teacher_rollout(batch, teacher, block, todo)
    per_block = [(todo & (block == b)).sum(-1).max().item() for b in block.unique().tolist()]
    assert forwards == len(calls) == max(per_block) <= 4
    if is_block_causal:
        assert sum(per_block) > forwards  # the blocks did not wait for each other
    # Replayed by hand, row by row and block by block: each forward commits the most confident open position
    # of every block to the teacher's argmax there.
    state = {**batch, "input_ids": batch["input_ids"].clone()}
    left = todo.clone()
    for _ in range(forwards):
        confidence, argmax = teacher(state).softmax(-1).max(-1)
        for row in range(rows):
            for b in block[row][left[row]].unique().tolist():
                open_ = (left[row] & (block[row] == b)).nonzero().flatten()
                position = open_[confidence[row, open_].argmax()]
                assert tokens[row, position] == argmax[row, position]
                state["input_ids"][row, 2 + position] = argmax[row, position]
                left[row, position] = False
    assert not left.any()
    assert torch.equal(batch["input_ids"][:, 2:][todo], torch.full_like(tokens[todo], MASK))  # not modified


def test_make_student_states_calls_the_teacher_at_most_block_length_times():
    rows, length = 4, 16
    generator = torch.Generator().manual_seed(2)
    batch = {
        "input_ids": torch.full((rows, length + 1), MASK),
        "position_ids": torch.arange(length + 1).expand(rows, -1),
        "keep": torch.arange(1, length + 1),
        "loss_mask": torch.ones(rows, length, dtype=torch.bool),
        "targets": torch.randint(1, 7, (rows, length), generator=generator),
    }
    calls: list[int] = []
    out, moved = make_student_states(
        batch,
        torch.ones(rows, dtype=torch.bool),
        random_teacher([]),  # the student: any scorer of the state
        random_teacher(calls),
        block_length=4,
        is_block_causal=True,
        tokens_per_step=1,
        labels="rollout",
    )
    assert len(calls) == 3  # 4 blocks of 4, one token committed by the student in each: 3 left per block
    assert (batch["loss_mask"] & ~out["loss_mask"]).sum() == rows * 4
