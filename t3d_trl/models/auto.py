"""Loading checkpoints as diffusion LMs and attaching the generation mixin to built models."""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoTokenizer,
    PreTrainedModel,
)

from ..generation.configuration import DiffusionGenerationConfig
from ..generation.mixin import DiffusionGenerationMixin
from .diffusion_config import DiffusionConfig

# Keyword arguments of ``from_pretrained`` that also apply to loading a config or a tokenizer.
_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "trust_remote_code", "subfolder")


@cache
def _with_mixin(cls: type) -> type:
    # Same name and module as the original class, so save_pretrained records the original architecture.
    return type(cls.__name__, (DiffusionGenerationMixin, cls), {"__module__": cls.__module__})


def _transformers_model(model: torch.nn.Module) -> PreTrainedModel:
    get_base = getattr(model, "get_base_model", None)  # peft.PeftModel
    inner = get_base() if callable(get_base) else model
    if not isinstance(inner, PreTrainedModel):
        raise TypeError(
            f"expected a transformers PreTrainedModel or a peft PeftModel, got {type(model).__name__}"
        )
    return inner


def add_diffusion_generation(
    model: torch.nn.Module,
    diffusion_config: DiffusionConfig | dict | None = None,
    generation_config: DiffusionGenerationConfig | dict | None = None,
) -> torch.nn.Module:
    """Give an already-built model (or a ``peft`` ``PeftModel``) ``diffusion_generate``.

    The diffusion description and generation defaults, when given, are stored in the model's config so that
    ``save_pretrained`` keeps them. Returns the same object (its class gains :class:`DiffusionGenerationMixin`;
    for a ``PeftModel`` the wrapped transformers model does, and the wrapper forwards the call).
    """
    inner = _transformers_model(model)
    if isinstance(diffusion_config, dict):
        diffusion_config = DiffusionConfig.from_dict(diffusion_config)
    if diffusion_config is not None:
        diffusion_config.save_to_model_config(inner.config)
    elif DiffusionConfig.from_model_config(inner.config) is None:
        raise ValueError(
            f"{type(inner).__name__}'s config has no diffusion description: pass "
            "diffusion_config=DiffusionConfig(mask_token_id=...)"
        )
    if isinstance(generation_config, dict):
        generation_config = DiffusionGenerationConfig.from_dict(generation_config)
    if generation_config is not None:
        generation_config.save_to_model_config(inner.config)
    if not isinstance(inner, DiffusionGenerationMixin):
        inner.__class__ = _with_mixin(type(inner))
    return model


def _infer_diffusion_config(name_or_path: str, config: Any, hub_kwargs: dict[str, Any]) -> DiffusionConfig:
    mask_id = getattr(config, "mask_token_id", None)
    if mask_id is None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(name_or_path, **hub_kwargs)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"{name_or_path} has no diffusion description in its config and its tokenizer could not be "
                f"loaded to find a mask token ({err}); pass diffusion_config=DiffusionConfig(mask_token_id=...)"
            ) from err
        mask_id = tokenizer.mask_token_id
    if mask_id is None:
        raise ValueError(
            f"{name_or_path}: neither its config nor its tokenizer defines a mask token; pass "
            "diffusion_config=DiffusionConfig(mask_token_id=...)"
        )
    return DiffusionConfig(mask_token_id=int(mask_id), attention="bidirectional")


def _is_masked_lm(config: Any) -> bool:
    return any(arch.endswith("ForMaskedLM") for arch in (getattr(config, "architectures", None) or []))


class AutoModelForDiffusionLM:
    """Load any supported checkpoint as a masked diffusion LM with ``diffusion_generate``.

    Example::

        model = AutoModelForDiffusionLM.from_pretrained("path/or/repo", dtype=torch.bfloat16)
        out = model.diffusion_generate(input_ids, tokens_per_step=2)
    """

    def __init__(self) -> None:
        raise OSError("use AutoModelForDiffusionLM.from_pretrained(...) or .from_config(...)")

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str,
        *,
        diffusion_config: DiffusionConfig | dict | None = None,
        generation_config: DiffusionGenerationConfig | dict | None = None,
        **hf_kwargs: Any,
    ) -> PreTrainedModel:
        """Load a checkpoint (local folder or Hub repo id) and attach :class:`DiffusionGenerationMixin`.

        Args:
            pretrained_model_name_or_path: anything ``transformers`` can load.
            diffusion_config: overrides the description stored in the checkpoint. Needed for decoders that
                were never saved by t3d-trl; encoder MLMs default to bidirectional with the tokenizer's mask.
            generation_config: overrides the decoding defaults stored in the checkpoint.
            **hf_kwargs: passed to ``from_pretrained`` (``dtype``, ``revision``, ``device_map``, ...).
        """
        hub_kwargs = {k: hf_kwargs[k] for k in _HUB_KWARGS if k in hf_kwargs}
        config = AutoConfig.from_pretrained(pretrained_model_name_or_path, **hub_kwargs)
        loader = AutoModelForMaskedLM if _is_masked_lm(config) else AutoModelForCausalLM
        model = loader.from_pretrained(pretrained_model_name_or_path, **hf_kwargs)
        if diffusion_config is None and DiffusionConfig.from_model_config(model.config) is None:
            diffusion_config = _infer_diffusion_config(
                pretrained_model_name_or_path, model.config, hub_kwargs
            )
        return add_diffusion_generation(model, diffusion_config, generation_config)

    @classmethod
    def from_config(
        cls,
        config: Any,
        *,
        diffusion_config: DiffusionConfig | dict | None = None,
        generation_config: DiffusionGenerationConfig | dict | None = None,
        **kwargs: Any,
    ) -> PreTrainedModel:
        """Build a randomly initialised model from a transformers config (tests, pre-training a teacher)."""
        loader = AutoModelForMaskedLM if _is_masked_lm(config) else AutoModelForCausalLM
        model = loader.from_config(config, **kwargs)
        return add_diffusion_generation(model, diffusion_config, generation_config)
