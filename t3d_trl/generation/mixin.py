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
        generation_config: DiffusionGenerationConfig | dict[str, Any] | None = None,
        generator: torch.Generator | None = None,
        streamer: DiffusionStreamer | None = None,
        token_type_ids: torch.Tensor | None = None,
        **overrides: Any,
    ) -> torch.Tensor | DiffusionGenerationOutput:
        """Generate completions by masked diffusion.

        Args:
            input_ids: ``[B, P]`` left-padded prompt ids.
            attention_mask: ``[B, P]`` 1 for prompt tokens, 0 for (left) padding.
            generation_config: settings (a config, or a dict of its fields: a whole config); defaults to the ones
                saved with the model.
            generator: a ``torch.Generator`` for reproducible sampling and random remasking.
            streamer: a :class:`~t3d_trl.generation.streamers.DiffusionStreamer` that sees the canvas after every
                forward pass (e.g. :class:`~t3d_trl.generation.streamers.TerminalStreamer`); it changes nothing.
            token_type_ids: accepted so that a BERT-style tokenizer's batch can be passed as ``**batch``; it must
                be all zeros (one segment, what the model assumes without it) and is not used.
            **overrides: any :class:`DiffusionGenerationConfig` field, e.g. ``tokens_per_step=2``.

        Returns:
            ``[B, P + max_new_tokens]`` sequences, or a :class:`DiffusionGenerationOutput` when
            ``return_dict_in_generate=True``.
        """
        if token_type_ids is not None and bool(torch.as_tensor(token_type_ids).any()):
            raise ValueError(
                "token_type_ids marks a second segment: diffusion_generate decodes one prompt segment"
            )
        config = DiffusionGenerationConfig.parse(generation_config) or self.diffusion_generation_config
        config = config.update(**overrides)
        return diffusion_generate(
            self, self.diffusion_config, input_ids, attention_mask, config, generator, streamer=streamer
        )
