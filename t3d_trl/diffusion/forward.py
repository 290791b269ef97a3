"""One forward pass of a diffusion LM, whatever its family.

Decoders (Llama, Qwen2/3, Mistral, ...) get an additive 4D float mask and compute vocabulary logits only at
the positions a step uses (``logits_to_keep`` with an index tensor). Encoder MLMs (BERT, ModernBERT) take a
2D padding mask and return logits for every position, which are then sliced. Models with shifted logits
(Dream) predict token ``i`` at position ``i - 1``; that shift is applied here, so callers always ask for the
positions whose tokens they want. Callers count positions from 0 over real tokens (left padding gets 0);
:func:`position_offset` says how a model numbers them.
"""

from __future__ import annotations

import inspect
from functools import cache as _memoize
from typing import Any

import torch
from transformers import PreTrainedModel

from .config import DiffusionConfig


def unwrap_model(model: torch.nn.Module) -> PreTrainedModel:
    """The transformers model inside DDP / DeepSpeed (``.module``), ``torch.compile`` (``._orig_mod``) and ``peft``
    (``get_base_model``) wrappers."""
    while not isinstance(model, PreTrainedModel):
        if isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        elif callable(getattr(model, "get_base_model", None)):
            model = model.get_base_model()
        elif isinstance(getattr(model, "module", None), torch.nn.Module):
            model = model.module
        else:
            raise TypeError(
                f"expected a transformers PreTrainedModel (or a wrapper of one), got {type(model).__name__}"
            )
    return model


@_memoize
def _forward_params(cls: type) -> frozenset[str]:
    return frozenset(inspect.signature(cls.forward).parameters)


def accepts_4d_mask(model: torch.nn.Module) -> bool:
    """Decoders that take ``logits_to_keep`` take additive 4D masks; encoder MLMs do not."""
    return "logits_to_keep" in _forward_params(type(unwrap_model(model)))


def position_offset(model: torch.nn.Module) -> int | None:
    """What to add to 0-based position ids for ``model``'s forward; ``None`` when its forward takes none.

    RoBERTa-style encoders (RoBERTa, XLM-R, CamemBERT, ...) number positions from ``padding_idx + 1``: their
    position embedding reserves ``padding_idx``. LLaDA's published remote code takes no ``position_ids`` (it
    always numbers ``0..L-1``).
    """
    inner = unwrap_model(model)
    if "position_ids" not in _forward_params(type(inner)):
        return None
    embeddings = getattr(inner.base_model, "embeddings", None)
    padding_idx = getattr(getattr(embeddings, "position_embeddings", None), "padding_idx", None)
    return 0 if padding_idx is None else padding_idx + 1


def max_positions(model: torch.nn.Module) -> int | None:
    """How many positions ``model`` numbers from 0: ``max_position_embeddings`` less the ids its numbering skips
    (RoBERTa's ``padding_idx + 1``: 512 of 514); ``None`` when the config sets no limit."""
    inner = unwrap_model(model)
    limit = getattr(inner.config, "max_position_embeddings", None)
    return None if limit is None else limit - (position_offset(inner) or 0)


def checked_vocab_size(model: torch.nn.Module, diffusion: DiffusionConfig) -> int:
    """The number of logits the model scores (output head, else input embeddings): it bounds every id it can emit.

    Refuses a mask token outside it, the one check the sampler, trajectory collection and the trainer share.
    """
    head = model.get_output_embeddings()
    vocab = (head if head is not None else model.get_input_embeddings()).weight.shape[0]
    if diffusion.mask_token_id >= vocab:
        raise ValueError(
            f"mask_token_id={diffusion.mask_token_id} is outside the model's vocabulary of {vocab}"
        )
    return vocab


def cache_keyword(model: torch.nn.Module) -> str:
    """transformers 5.24 renamed ``past_key_values`` to ``cache``; support both spellings."""
    return "cache" if "cache" in _forward_params(type(unwrap_model(model))) else "past_key_values"


def diffusion_forward(
    model: torch.nn.Module,
    diffusion: DiffusionConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    keep: torch.Tensor | None = None,
    cache: Any = None,
    use_cache: bool = False,
) -> tuple[torch.Tensor, Any]:
    """Run ``model`` and return ``(logits, cache)``.

    Args:
        model: a transformers model (a decoder accepting 4D masks, or an encoder MLM), or a DDP / DeepSpeed /
            ``peft`` wrapper of one (the wrapper is called, so gradient sync and adapters stay in the loop).
        diffusion: the model's diffusion description (for the logit shift).
        input_ids: ``[B, L]`` tokens fed this pass.
        attention_mask: ``[B, 1, L, past + L]`` additive float mask for decoders, ``[B, L]`` 0/1 for encoders.
        position_ids: ``[B, L]``, counted from 0 (see :func:`position_offset`).
        keep: 1-D indices into the ``L`` input positions whose token predictions are wanted; ``None`` = all.
        cache: a transformers ``Cache`` (decoders only).
        use_cache: whether the pass should append its keys/values to ``cache``.

    Returns:
        ``logits`` of shape ``[B, len(keep), V]`` (or ``[B, L, V]``) and the cache object.
    """
    source = keep
    if keep is not None and diffusion.shift_logits:
        source = (keep - 1).clamp_min(0)
    kwargs: dict[str, Any] = {}
    offset = position_offset(model)
    if offset is not None:
        kwargs["position_ids"] = position_ids + offset
    if accepts_4d_mask(model):
        kwargs["use_cache"] = use_cache
        if cache is not None:
            kwargs[cache_keyword(model)] = cache
        if source is not None:
            kwargs["logits_to_keep"] = source
        out = model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        logits = out.logits
        new_cache = cache  # a passed Cache object is updated in place
    else:
        if attention_mask.dim() != 2:
            raise ValueError(
                f"{type(model).__name__} is an encoder MLM and takes a 2D padding mask, got shape "
                f"{tuple(attention_mask.shape)}; block-causal attention needs a decoder model"
            )
        out = model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        logits = out.logits if source is None else out.logits[:, source]
        new_cache = None
    if keep is None and diffusion.shift_logits:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return logits, new_cache
