"""t3d-trl: few-step diffusion language models via trajectory self-distillation (T3D)."""

__version__ = "0.1.0.dev0"

# models first: its auto module imports the generation mixin.
from .models import (  # isort: skip
    AutoModelForDiffusionLM,
    DiffusionConfig,
    add_diffusion_generation,
    convert_checkpoint,
)
from .analysis import TotalCorrelationConfig, TotalCorrelationResult, total_correlation
from .data.hub import load_trajectories, push_trajectories_to_hub
from .data.schema import TrajectoryMetadata
from .data.trajectories import collect_trajectories
from .evaluation.benchmarks import Benchmark, register_benchmark
from .evaluation.runner import evaluate_model, run_grid
from .generation import DiffusionGenerationConfig, DiffusionGenerationMixin, DiffusionGenerationOutput
from .trainer import T3DConfig, T3DTrainer

__all__ = [
    "AutoModelForDiffusionLM",
    "Benchmark",
    "DiffusionConfig",
    "DiffusionGenerationConfig",
    "DiffusionGenerationMixin",
    "DiffusionGenerationOutput",
    "T3DConfig",
    "T3DTrainer",
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
