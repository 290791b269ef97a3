"""Student states' teacher labels on scripted teachers: the rollout is the teacher's own one-token-per-step
greedy completion, not its per-position argmax; the student and the teacher see the sampler's state (masks), not
the collator's random tokens."""

from __future__ import annotations

import pytest
import torch
from testing_utils import build_bidirectional_model, build_block_causal_model

from t3d_trl import DiffusionConfig
from t3d_trl.data.collator import DataCollatorForDiffusion, diffusion_attention_mask
from t3d_trl.models.forward import diffusion_forward
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


def states(labels: str, batch: dict | None = None, scorer=student) -> tuple[dict, dict, TwoModeTeacher]:
    teacher = TwoModeTeacher()
    out, moved = make_student_states(
        two_mode_batch() if batch is None else batch,
        torch.tensor([True, False]),
        scorer,
        teacher,
        block_length=4,
        is_block_causal=False,
        tokens_per_step=1,
        mask_token_id=MASK,
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


@pytest.mark.parametrize("labels", ["argmax", "rollout"])
def test_student_and_teacher_see_masks_where_the_collator_showed_random_tokens(labels):
    # The collator showed random tokens (Y, X) at two masked positions of each row. The sampler never holds such
    # a state: the student's step and the teacher's labels run with masks there, and the random tokens only
    # return in the training input, at the positions that stay masked.
    batch = two_mode_batch()
    batch["input_ids"][:, 1:3] = torch.tensor([Y, X])
    seen: list[list[int]] = []

    def recording_student(state):
        seen.extend(state["input_ids"][:, state["keep"]].tolist())
        return student(state)

    out, moved, teacher = states(labels, batch, recording_student)
    assert seen == [[MASK, MASK, MASK, MASK]]
    # What the teacher saw and labelled is the clean-input case's, exactly (a Y shown would decide the answer).
    clean, _, clean_teacher = states(labels)
    assert teacher.states == clean_teacher.states and teacher.states[0] == [STUDENT, MASK, MASK, MASK]
    assert torch.equal(out["targets"], clean["targets"]) and torch.equal(out["loss_mask"], clean["loss_mask"])
    # Training input: the student's token where it committed (over the random Y), the random X where still masked.
    assert out["input_ids"][0].tolist() == moved["input_ids"][0].tolist() == [PROMPT, STUDENT, X, MASK, MASK]
    assert out["input_ids"][1].tolist() == [PROMPT, Y, X, MASK, MASK]  # a row that did not move


def tiny_logits(model, block_causal: bool):
    diffusion = DiffusionConfig.from_model_config(model.config)

    def logits(batch):
        mask = diffusion_attention_mask(batch, 4, block_causal, torch.float32, True)
        return diffusion_forward(
            model, diffusion, batch["input_ids"], mask, batch["position_ids"], keep=batch["keep"]
        )[0]

    return logits


@pytest.mark.parametrize("block_causal", [False, True])
@pytest.mark.parametrize("labels", ["argmax", "rollout"])
def test_random_tokens_change_only_the_training_input(tokenizer, block_causal, labels):
    # The collator draws the same masks with and without random tokens (same seed and row), so student states
    # made from either batch must commit the same tokens and carry the same labels: those of the mask state.
    build = build_block_causal_model if block_causal else build_bidirectional_model
    student_model, teacher_model = build(tokenizer, seed=1), build(tokenizer, seed=2, initializer_range=0.2)
    rows = [
        {"prompt_ids": [1, 10, 11, 12, 13, 14, 15], "completion_ids": list(range(20, 32)), "row_index": 0},
        {"prompt_ids": [1, 10, 11], "completion_ids": list(range(40, 50)), "row_index": 1},
    ]
    rows[0]["decode_step"], rows[1]["decode_step"] = list(range(1, 13)), [2, 1, 4, 3, 6, 5, 8, 7, 10, 9]
    diffusion = DiffusionConfig.from_model_config(student_model.config)
    made, batches = {}, {}
    for prob in (0.0, 0.5):
        collator = DataCollatorForDiffusion(
            diffusion, 4, tokenizer.pad_token_id, random_token_prob=prob, vocab_size=len(tokenizer), seed=3
        )
        batches[prob] = collator(rows)
        made[prob], _ = make_student_states(
            batches[prob],
            torch.ones(2, dtype=torch.bool),
            tiny_logits(student_model, block_causal),
            tiny_logits(teacher_model, block_causal),
            block_length=4,
            is_block_causal=block_causal,
            tokens_per_step=2,
            mask_token_id=tokenizer.mask_token_id,
            labels=labels,
        )
    keep, clean, mixed = batches[0.0]["keep"], made[0.0], made[0.5]
    shows_random = batches[0.5]["input_ids"][:, keep] != batches[0.0]["input_ids"][:, keep]
    assert torch.equal(batches[0.5]["loss_mask"], batches[0.0]["loss_mask"]) and shows_random.any()
    assert torch.equal(mixed["loss_mask"], clean["loss_mask"])
    assert torch.equal(mixed["targets"], clean["targets"])
    assert (clean["targets"] != batches[0.0]["targets"]).any()  # the teacher did relabel
    committed = batches[0.0]["loss_mask"] & ~clean["loss_mask"]
    assert (committed & shows_random).any()  # the student's proposal replaced a random token
    # The training input: the student state, with the collator's random tokens where it is still masked.
    random_left = shows_random & clean["loss_mask"]
    assert random_left.any()
    expected = torch.where(random_left, batches[0.5]["input_ids"][:, keep], clean["input_ids"][:, keep])
    assert torch.equal(mixed["input_ids"][:, keep], expected)


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
        mask_token_id=MASK,
        labels="rollout",
    )
    assert len(calls) == 3  # 4 blocks of 4, one token committed by the student in each: 3 left per block
    assert (batch["loss_mask"] & ~out["loss_mask"]).sum() == rows * 4
