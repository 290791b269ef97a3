"""Callbacks for ``T3DTrainer`` runs: evaluation at chosen steps along one run (learning curves).

A learning curve made of separate runs per budget retrains from scratch for every point and, with a decaying
learning-rate schedule, measures a different run at each point. :class:`EvaluateAtSteps` instead evaluates the
model of ONE run as it passes the given optimizer steps, and leaves that run exactly as it would have been
without the evaluations: the model is put back in training mode and every random number generator the run
draws from (Python, NumPy, torch on CPU and on every GPU) is restored, so decoding during an evaluation cannot
shift the noise of later training steps.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


class EvaluateAtSteps(TrainerCallback):
    """Call ``evaluate(model, step)`` when the run has finished optimizer step ``step``, for each of ``steps``.

    The model is in eval mode (and under ``torch.no_grad``) during the call and in training mode afterwards; the
    generators' states are restored, so the run's later steps are bit-identical to a run without this callback.
    Steps beyond the run's ``max_steps`` are never reached: :meth:`missing` names them after training.

    Args:
        steps: optimizer steps (global steps, counted from 1) after which to evaluate.
        evaluate: called with the model being trained and the step; what it returns is kept in :attr:`results`.
    """

    def __init__(self, steps: Iterable[int], evaluate: Callable[[torch.nn.Module, int], Any]):
        self.steps = sorted({int(s) for s in steps})
        if any(s < 1 for s in self.steps):
            raise ValueError(f"evaluation steps are optimizer steps counted from 1, got {self.steps}")
        self.evaluate = evaluate
        self.results: dict[int, Any] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.steps and state.global_step not in self.results:
            rng = _rng_state()
            model.eval()
            try:
                with torch.no_grad():
                    self.results[state.global_step] = self.evaluate(model, state.global_step)
            finally:
                model.train()
                _restore_rng_state(rng)
        return control

    def missing(self) -> list[int]:
        """The requested steps at which nothing was evaluated (the run ended before them)."""
        return [s for s in self.steps if s not in self.results]
