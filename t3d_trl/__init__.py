"""t3d-trl: few-step diffusion language models via trajectory self-distillation (T3D).

The public names below are imported on first use (PEP 562), so ``import t3d_trl`` and the ``t3d-trl`` command
line start without loading torch, transformers and TRL until a command needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .utils import lazy_exports
from .version import __version__

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "AutoModelForDiffusionLM": ".models",
    "DiffusionConfig": ".models",
    "add_diffusion_generation": ".models",
    "convert_checkpoint": ".models",
    "TotalCorrelationConfig": ".analysis",
    "TotalCorrelationResult": ".analysis",
    "total_correlation": ".analysis",
    "load_trajectories": ".data.hub",
    "push_trajectories_to_hub": ".data.hub",
    "TrajectoryMetadata": ".data.schema",
    "collect_trajectories": ".data.trajectories",
    "Benchmark": ".evaluation.benchmarks",
    "register_benchmark": ".evaluation.benchmarks",
    "evaluate_model": ".evaluation.runner",
    "run_grid": ".evaluation.runner",
    "DiffusionGenerationConfig": ".generation",
    "DiffusionGenerationMixin": ".generation",
    "DiffusionGenerationOutput": ".generation",
    "DiffusionIteratorStreamer": ".generation",
    "DiffusionStreamer": ".generation",
    "TerminalStreamer": ".generation",
    "T3DConfig": ".trainer",
    "T3DTrainer": ".trainer",
}

__all__ = [
    "AutoModelForDiffusionLM",
    "Benchmark",
    "DiffusionConfig",
    "DiffusionGenerationConfig",
    "DiffusionGenerationMixin",
    "DiffusionGenerationOutput",
    "DiffusionIteratorStreamer",
    "DiffusionStreamer",
    "T3DConfig",
    "T3DTrainer",
    "TerminalStreamer",
    "TotalCorrelationConfig",
    "TotalCorrelationResult",
    "TrajectoryMetadata",
    "__version__",
    "add_diffusion_generation",
    "collect_trajectories",
    "convert_checkpoint",
    "evaluate_model",
    "load_trajectories",
    "push_trajectories_to_hub",
    "register_benchmark",
    "run_grid",
    "total_correlation",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # static analysers and IDEs see the real names
    from .analysis import TotalCorrelationConfig, TotalCorrelationResult, total_correlation
    from .data.hub import load_trajectories, push_trajectories_to_hub
    from .data.schema import TrajectoryMetadata
    from .data.trajectories import collect_trajectories
    from .evaluation.benchmarks import Benchmark, register_benchmark
    from .evaluation.runner import evaluate_model, run_grid
    from .generation import (
        DiffusionGenerationConfig,
        DiffusionGenerationMixin,
        DiffusionGenerationOutput,
        DiffusionIteratorStreamer,
        DiffusionStreamer,
        TerminalStreamer,
    )
    from .models import AutoModelForDiffusionLM, DiffusionConfig, add_diffusion_generation, convert_checkpoint
    from .trainer import T3DConfig, T3DTrainer
