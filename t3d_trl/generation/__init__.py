# Models first: `models.auto` imports the mixin, and the mixin imports `models.diffusion_config`; starting from
# the models package resolves that cycle whichever package a caller imports first.
from .. import models as _models  # noqa: F401  # isort: skip
from .configuration import DiffusionGenerationConfig
from .mixin import DiffusionGenerationMixin
from .sampler import DiffusionGenerationOutput
from .streamers import DiffusionIteratorStreamer, DiffusionStep, DiffusionStreamer, TerminalStreamer

__all__ = [
    "DiffusionGenerationConfig",
    "DiffusionGenerationMixin",
    "DiffusionGenerationOutput",
    "DiffusionIteratorStreamer",
    "DiffusionStep",
    "DiffusionStreamer",
    "TerminalStreamer",
]
