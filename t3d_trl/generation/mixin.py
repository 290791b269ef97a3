"""``DiffusionGenerationMixin``: gives a transformers model ``diffusion_generate``."""

from __future__ import annotations

from typing import Any

import torch

from ..diffusion.config import DiffusionConfig, require_diffusion_config
from .configuration import DiffusionGenerationConfig
from .sampler import DiffusionGenerationOutput, diffusion_generate
from .streamers import DiffusionStreamer


class DiffusionGenerationMixin:
    """Few-step masked diffusion decoding for any model with a :class:`DiffusionConfig` in its config.

    Mixed into a model by :func:`t3d_trl.add_diffusion_generation` or
    :meth:`t3d_trl.AutoModelForDiffusionLM.from_pretrained`.
    """

    @property
    def diffusion_config(self) -> DiffusionConfig:
        return require_diffusion_config(self)

    @property
    def diffusion_generation_config(self) -> DiffusionGenerationConfig:
        """Decoding defaults stored with the model."""
        return DiffusionGenerationConfig.from_model_config(self.config)

    @torch.no_grad()
    def diffusion_generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        generation_config: DiffusionGenerationConfig | None = None,
        generator: torch.Generator | None = None,
        streamer: DiffusionStreamer | None = None,
        **overrides: Any,
    ) -> torch.Tensor | DiffusionGenerationOutput:
        """Generate completions by masked diffusion.

        Args:
            input_ids: ``[B, P]`` left-padded prompt ids.
            attention_mask: ``[B, P]`` 1 for prompt tokens, 0 for (left) padding.
            generation_config: settings; defaults to the ones saved with the model.
            generator: a ``torch.Generator`` for reproducible sampling and random remasking.
            streamer: a :class:`~t3d_trl.generation.streamers.DiffusionStreamer` that sees the canvas after every
                forward pass (e.g. :class:`~t3d_trl.generation.streamers.TerminalStreamer`); it changes nothing.
            **overrides: any :class:`DiffusionGenerationConfig` field, e.g. ``tokens_per_step=2``.

        Returns:
            ``[B, P + max_new_tokens]`` sequences, or a :class:`DiffusionGenerationOutput` when
            ``return_dict_in_generate=True``.
        """
        config = (generation_config or self.diffusion_generation_config).update(**overrides)
        return diffusion_generate(
            self, self.diffusion_config, input_ids, attention_mask, config, generator, streamer=streamer
        )
