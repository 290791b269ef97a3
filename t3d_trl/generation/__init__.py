from .configuration import DiffusionGenerationConfig
from .mixin import DiffusionGenerationMixin
from .sampler import DiffusionGenerationOutput

__all__ = ["DiffusionGenerationConfig", "DiffusionGenerationMixin", "DiffusionGenerationOutput"]
