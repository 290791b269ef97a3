"""EvaluateAtSteps on tiny T3DTrainer runs: evaluations at the requested steps that leave the run unchanged."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from testing_utils import build_bidirectional_model, build_trajectories
from transformers import TrainerCallback

from t3d_trl.trainer import EvaluateAtSteps, T3DConfig, T3DTrainer

PROMPTS = ["hello", "what is 2+2", "abc", "the cat sat"]


@pytest.fixture(scope="module")
def trajectories(tokenizer):
    return build_trajectories(build_bidirectional_model(tokenizer, seed=1), tokenizer, PROMPTS)


class _Probe(TrainerCallback):
    """Listed after the evaluator: what the next callbacks and steps see (train mode, every generator's state)."""

    def __init__(self):
        self.training: dict[int, bool] = {}
        self.rng: list[tuple] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.training[state.global_step] = model.training
        self.rng.append(
            (random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist())
        )


def _run(tokenizer, trajectories, tmp_path, callbacks, max_steps=4):
    """A TD run of ``max_steps`` on the tiny bidirectional model; attention dropout makes every step draw from
    torch's global generator, so a shifted generator changes the weights."""
    args = T3DConfig(
        output_dir=str(tmp_path / "out"),
        loss_type="td",
        max_steps=max_steps,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        save_strategy="no",
        report_to="none",
        activation_checkpointing=False,
        disable_tqdm=True,
        seed=7,
    )
    model = build_bidirectional_model(tokenizer, seed=1, attention_dropout=0.5)
    trainer = T3DTrainer(
        model, args, train_dataset=trajectories, processing_class=tokenizer, callbacks=callbacks
    )
    trainer.train()
    return trainer


def _noisy_evaluate(tokenizer):
    """An evaluation that draws from every generator: Python, NumPy, torch (directly and by sampled decoding)."""
    calls = []

    def evaluate(model, step):
        calls.append((step, model.training, torch.is_grad_enabled()))
        random.random()
        np.random.rand(3)
        torch.rand(5)
        prompts = tokenizer(PROMPTS[:2], return_tensors="pt", padding=True)
        out = model.diffusion_generate(
            prompts.input_ids,
            attention_mask=prompts.attention_mask,
            max_new_tokens=8,
            block_length=4,
            steps=8,
            temperature=1.0,
        )
        return {"step": step, "completion": out[:, -8:].tolist()}

    return evaluate, calls


def test_evaluates_at_the_requested_steps_in_eval_mode_and_hands_back_a_training_model(
    tokenizer, trajectories, tmp_path
):
    evaluate, calls = _noisy_evaluate(tokenizer)
    evaluator, probe = EvaluateAtSteps([4, 2, 9, 2], evaluate), _Probe()
    assert evaluator.steps == [2, 4, 9]  # sorted, duplicates dropped
    trainer = _run(tokenizer, trajectories, tmp_path, [evaluator, probe])
    assert trainer.state.global_step == 4
    # Called once at each reached step, in eval mode without gradients; results are kept by step.
    assert calls == [(2, False, False), (4, False, False)]
    assert sorted(evaluator.results) == [2, 4]
    assert all(evaluator.results[step]["step"] == step for step in (2, 4))
    assert len(evaluator.results[2]["completion"]) == 2
    # Back in training mode before any later callback or step sees the model.
    assert probe.training == {1: True, 2: True, 3: True, 4: True}
    # A step beyond max_steps is never reached and is named.
    assert evaluator.missing() == [9]


def test_a_run_with_evaluations_ends_with_the_weights_of_a_run_without(tokenizer, trajectories, tmp_path):
    evaluate, calls = _noisy_evaluate(tokenizer)
    plain_probe, probe = _Probe(), _Probe()
    plain = _run(tokenizer, trajectories, tmp_path / "plain", [plain_probe])
    evaluated = _run(
        tokenizer, trajectories, tmp_path / "evaluated", [EvaluateAtSteps([1, 3], evaluate), probe]
    )
    assert [step for step, *_ in calls] == [1, 3]
    # Every generator is where it would have been without the evaluations...
    assert probe.rng == plain_probe.rng
    # ... so the dropout masks, hence the weights, are bit-identical.
    plain_state, evaluated_state = plain.model.state_dict(), evaluated.model.state_dict()
    assert plain_state.keys() == evaluated_state.keys()
    for name, tensor in plain_state.items():
        assert torch.equal(tensor, evaluated_state[name]), name


def test_the_run_draws_from_torchs_generator_so_the_identity_above_means_something(
    tokenizer, trajectories, tmp_path
):
    # Without restoring, the same evaluation would change the run: attention dropout draws every step.
    plain = _run(tokenizer, trajectories, tmp_path / "plain", [], max_steps=2)

    class Unrestored(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            torch.rand(5)

    shifted = _run(tokenizer, trajectories, tmp_path / "shifted", [Unrestored()], max_steps=2)
    assert not all(
        torch.equal(a, b)
        for a, b in zip(plain.model.state_dict().values(), shifted.model.state_dict().values())
    )


@pytest.mark.parametrize("steps", [[0, 5], [-1]])
def test_steps_before_the_first_optimizer_step_are_refused(steps):
    with pytest.raises(ValueError, match="counted from 1"):
        EvaluateAtSteps(steps, lambda model, step: None)
