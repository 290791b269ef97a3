"""What every layer needs to run a checkpoint as a masked diffusion LM: the diffusion description
(:class:`DiffusionConfig`), one forward pass whatever the family (:mod:`.forward`) and the attention masks
(:mod:`.masks`). It sits beneath ``generation`` and ``models``, which both use it; ``t3d_trl.models`` re-exports
it under its historical paths (``t3d_trl.models.diffusion_config``, ``.forward``, ``.masks``)."""

from .config import DiffusionConfig, require_diffusion_config

__all__ = ["DiffusionConfig", "require_diffusion_config"]
