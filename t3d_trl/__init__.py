"""t3d-trl: few-step diffusion language models via trajectory self-distillation (T3D)."""

__version__ = "0.1.0.dev0"

# models first: its auto module imports the generation mixin.
from .models import AutoModelForDiffusionLM, DiffusionConfig, add_diffusion_generation  # isort: skip
from .generation import DiffusionGenerationConfig, DiffusionGenerationMixin, DiffusionGenerationOutput

__all__ = [
    "AutoModelForDiffusionLM",
    "DiffusionConfig",
    "DiffusionGenerationConfig",
    "DiffusionGenerationMixin",
    "DiffusionGenerationOutput",
    "__version__",
    "add_diffusion_generation",
]
