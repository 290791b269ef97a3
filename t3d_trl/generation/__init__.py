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
