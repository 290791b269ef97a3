"""Few-step diffusion decoding: the settings, the sampler, the mixin that gives models ``diffusion_generate``, and
the step streamers.

The names below load on first use (PEP 562): ``generation.configuration`` imports without torch, so that the
command line builds its decoding flags from :class:`DiffusionGenerationConfig` without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..utils import lazy_exports

_EXPORTS = {
    "DiffusionGenerationConfig": ".configuration",
    "DiffusionGenerationMixin": ".mixin",
    "DiffusionGenerationOutput": ".sampler",
    "DiffusionIteratorStreamer": ".streamers",
    "DiffusionStep": ".streamers",
    "DiffusionStreamer": ".streamers",
    "TerminalStreamer": ".streamers",
}

__all__ = [
    "DiffusionGenerationConfig",
    "DiffusionGenerationMixin",
    "DiffusionGenerationOutput",
    "DiffusionIteratorStreamer",
    "DiffusionStep",
    "DiffusionStreamer",
    "TerminalStreamer",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:
    from .configuration import DiffusionGenerationConfig
    from .mixin import DiffusionGenerationMixin
    from .sampler import DiffusionGenerationOutput
    from .streamers import DiffusionIteratorStreamer, DiffusionStep, DiffusionStreamer, TerminalStreamer
