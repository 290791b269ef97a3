"""Classifier-free guidance for ``diffusion_generate`` (LLaDA's ``cfg_scale``).

The unconditional canvas is the decoding canvas with every prompt position replaced by the mask token; its
generated region follows the conditional one step by step. Both run as one batch of ``2B`` rows through the same
block runner (so every cache mode applies to both halves alike), and the step's logits are LLaDA's
``un + (cfg_scale + 1) * (cond - un)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .sampler import Canvas


def guide_logits(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """LLaDA's guidance, in float32 whatever the model's dtype: ``un + (scale + 1) * (cond - un)``."""
    uncond = uncond.float()
    return uncond + (scale + 1.0) * (cond.float() - uncond)


class GuidedRunner:
    """A block runner whose logits are guided: wraps the runner that ``build_runner`` makes over a doubled canvas
    (the conditional rows, then the same rows with the prompt masked) and exposes the sampler's
    ``block_logits`` for the ``B`` conditional rows.

    Args:
        build_runner: makes the wrapped runner for a canvas (the sampler's ``BlockRunner`` with its cache
            settings).
        canvas: the decoding canvas of the ``B`` rows.
        mask_token_id: the model's mask token.
        scale: ``cfg_scale`` (> 0).
    """

    def __init__(
        self, build_runner: Callable[[Canvas], Any], canvas: Canvas, mask_token_id: int, scale: float
    ) -> None:
        generated = torch.zeros_like(canvas.valid).scatter_(1, canvas.gen_index, True)
        # Padding is never attended, so only real prompt tokens need hiding.
        self.prompt = canvas.valid & ~generated
        self.mask_token_id = mask_token_id
        self.scale = scale
        doubled = replace(
            canvas,
            tokens=self.unconditional_pair(canvas.tokens),
            valid=canvas.valid.repeat(2, 1),
            position_ids=canvas.position_ids.repeat(2, 1),
            gen_index=canvas.gen_index.repeat(2, 1),
        )
        self.runner = build_runner(doubled)

    def __getattr__(self, name: str) -> Any:
        # Everything but the logits (cache state, the model's step...) is the wrapped runner's.
        if name == "runner":  # not set yet: no recursion during __init__
            raise AttributeError(name)
        return getattr(self.runner, name)

    def unconditional_pair(self, x: torch.Tensor) -> torch.Tensor:
        """``[x; x with its prompt masked]``: the ``2B`` rows of one guided forward pass."""
        return torch.cat([x, x.masked_fill(self.prompt, self.mask_token_id)])

    def block_logits(
        self, x: torch.Tensor, start: int, end: int, cols: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Guided logits ``[B, len(cols), V]`` of the current block (see ``BlockRunner.block_logits``)."""
        cond, uncond = self.runner.block_logits(self.unconditional_pair(x), start, end, cols).chunk(2)
        return guide_logits(cond, uncond, self.scale)
