"""Loading checkpoints as diffusion LMs and attaching the generation mixin to built models."""

from __future__ import annotations

import json
import os
from functools import cache
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoTokenizer,
    PreTrainedModel,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING

from ..diffusion.config import CONFIG_KEY as DIFFUSION_KEY
from ..diffusion.config import DiffusionConfig
from ..diffusion.forward import unwrap_model
from ..generation.configuration import CONFIG_KEY as GENERATION_KEY
from ..generation.configuration import DiffusionGenerationConfig
from ..generation.mixin import DiffusionGenerationMixin
from ..utils import without_checkpointing_deprecation
from .convert import locate_weights
from .families import FAMILIES, ModelFamily, get_family
from .families.base import CONFIG_FILE, GENERATION_CONFIG_FILE, has_vocabulary, read_json
from .weights import check_weights

# Keyword arguments of ``from_pretrained`` that also apply to loading a config or a tokenizer.
# Keywords of from_pretrained that a config also holds: for the loader, not for the native config.
_LOADER_KWARGS = ("dtype", "torch_dtype", "attn_implementation", "quantization_config", "trust_remote_code")
_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "trust_remote_code", "subfolder")
# Keyword arguments that say where one checkpoint lives: an adapter's, not its base model's.
_LOCATION_KWARGS = ("revision", "subfolder")
# Keyword arguments of ``PeftModel.from_pretrained`` (an adapter's, not its base model's).
_PEFT_KWARGS = ("is_trainable", "adapter_name", "autocast_adapter_dtype", "ephemeral_gpu_offload")
ADAPTER_CONFIG_FILE = "adapter_config.json"  # peft's
#: An adapter folder has no ``config.json``: the trained decoding defaults and diffusion description go here.
ADAPTER_DEFAULTS_FILE = "diffusion_config.json"
# Keyword arguments of ``from_pretrained`` that load other weights than those: left to transformers to check.
_OTHER_WEIGHTS_KWARGS = ("variant", "use_safetensors", "gguf_file", "state_dict")


@cache
def _with_mixin(cls: type) -> type:
    # Same name and module as the original class, so save_pretrained records the original architecture.
    # transformers decides `can_generate` from base-class names ("...GenerationMixin"): keep the original answer.
    # pickle finds a class by module and name, which lead to the original: an instance pickles as the original
    # class plus its state, and is rebuilt with the mixin (torch.save, deepcopy, multiprocessing).
    namespace = {
        "__module__": cls.__module__,
        "can_generate": classmethod(lambda _: cls.can_generate()),
        "__reduce__": lambda self: (_new_with_mixin, (cls,), self.__getstate__()),
    }
    return type(cls.__name__, (DiffusionGenerationMixin, cls), namespace)


def _new_with_mixin(cls: type) -> torch.nn.Module:
    """An empty instance of ``cls`` with the mixin, for unpickling to fill in (``__setstate__``)."""
    mixed = _with_mixin(cls)
    return mixed.__new__(mixed)


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
    inner = unwrap_model(model)
    if isinstance(diffusion_config, dict):
        diffusion_config = DiffusionConfig.from_dict(diffusion_config)
    if diffusion_config is not None:
        diffusion_config.save_to_model_config(inner.config)
    elif DiffusionConfig.from_model_config(inner.config) is None:
        raise ValueError(
            f"{type(inner).__name__}'s config has no diffusion description: pass "
            "diffusion_config=DiffusionConfig(mask_token_id=...)"
        )
    generation_config = DiffusionGenerationConfig.parse(generation_config)
    if generation_config is not None:
        generation_config.save_to_model_config(inner.config)
    if not isinstance(inner, DiffusionGenerationMixin):
        inner.__class__ = _with_mixin(type(inner))
    return model


def check_model_source(name_or_path: str, *, weights: bool = True, **hub_kwargs: Any) -> None:
    """Fail at once, naming the path, when ``name_or_path`` cannot be a checkpoint, before anything loads.

    A local folder must hold a ``config.json`` (a model) or an ``adapter_config.json`` (a ``peft`` adapter), and
    (unless ``weights=False``) a weights file that is whole (:func:`check_weights`). Anything else must be a Hub
    repo id, and offline (``HF_HUB_OFFLINE=1`` or ``local_files_only``) one in the local cache: otherwise
    transformers reports a missing folder as a failed connection to the Hub. A Hub checkpoint already in the cache
    is checked like a folder: offline it must be complete; online only the files there must be whole (the loader
    downloads the others).

    Raises:
        FileNotFoundError: naming the folder or repo id and what is missing.
        ValueError: naming a damaged weights file.
    """
    if os.path.isdir(name_or_path):
        subfolder = hub_kwargs.get("subfolder")
        folder = os.path.join(name_or_path, subfolder) if subfolder else name_or_path
        if not any(os.path.isfile(os.path.join(folder, f)) for f in (CONFIG_FILE, ADAPTER_CONFIG_FILE)):
            raise FileNotFoundError(
                f"{name_or_path} has no {CONFIG_FILE} (nor a peft {ADAPTER_CONFIG_FILE}): not a model checkpoint"
            )
        if weights:
            check_weights(folder, adapter=os.path.isfile(os.path.join(folder, ADAPTER_CONFIG_FILE)))
        return
    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name_or_path)
    except HFValidationError as err:
        raise FileNotFoundError(f"model {name_or_path!r}: no such folder (nor a valid Hub repo id)") from err
    offline = constants.HF_HUB_OFFLINE or hub_kwargs.get("local_files_only")
    cached = cached_checkpoint_file(name_or_path, **hub_kwargs)
    if offline and cached is None:
        revision = hub_kwargs.get("revision")
        what = "the Hub repo" if revision in (None, "main") else f"revision {revision!r} of the Hub repo"
        raise FileNotFoundError(
            f"model {name_or_path!r}: no such folder, and offline (HF_HUB_OFFLINE=1) {what} "
            f"{name_or_path!r} is not in the local cache"
        )
    if weights and cached is not None:
        adapter = os.path.basename(cached) == ADAPTER_CONFIG_FILE
        check_weights(os.path.dirname(cached), adapter=adapter, complete=bool(offline))


def cached_checkpoint_file(name_or_path: str, **hub_kwargs: Any) -> str | None:
    """The path of Hub repo ``name_or_path``'s ``config.json`` (or a peft adapter's ``adapter_config.json``) in
    the local cache, at ``hub_kwargs``' ``revision``/``subfolder``/``cache_dir``; ``None`` when it is not cached.
    Its folder, ``snapshots/<commit>``, names the commit the revision resolved to."""
    from huggingface_hub import try_to_load_from_cache

    subfolder = hub_kwargs.get("subfolder")
    for name in (CONFIG_FILE, ADAPTER_CONFIG_FILE):
        path = try_to_load_from_cache(
            name_or_path,
            f"{subfolder}/{name}" if subfolder else name,
            cache_dir=hub_kwargs.get("cache_dir"),
            revision=hub_kwargs.get("revision"),
        )
        if isinstance(path, str):
            return path
    return None


def adapter_base_model(name_or_path: str, **hub_kwargs: Any) -> str | None:
    """The base model a ``peft`` adapter folder or repo names (``base_model_name_or_path``); ``None`` for a model."""
    adapter = read_json(name_or_path, ADAPTER_CONFIG_FILE, hub_kwargs, required=False)
    if adapter is None:
        return None
    base = adapter.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{name_or_path}: {ADAPTER_CONFIG_FILE} names no base_model_name_or_path")
    return base


def _base_kwargs(name_or_path: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for loading an adapter's base model: without the adapter's own location (``revision``,
    ``subfolder``), with the base revision its ``adapter_config.json`` records (peft's ``revision``, which
    peft's ``AutoPeftModel`` loads the base at too)."""
    hub_kwargs = {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}
    adapter = read_json(name_or_path, ADAPTER_CONFIG_FILE, hub_kwargs, required=False) or {}
    base = {k: v for k, v in kwargs.items() if k not in _LOCATION_KWARGS}
    if adapter.get("revision"):
        base["revision"] = adapter["revision"]
    return base


def load_tokenizer(name_or_path: str, **hub_kwargs: Any) -> Any:
    """The tokenizer of a checkpoint; a ``peft`` adapter saved without one (peft's default) gets its base model's.

    ``hub_kwargs``: ``revision``, ``token``, ``trust_remote_code``... as ``AutoTokenizer.from_pretrained`` takes.
    """
    try:
        return _own_tokenizer(name_or_path, hub_kwargs)
    except (OSError, ValueError):
        base = adapter_base_model(name_or_path, **hub_kwargs)
        if base is None:
            raise
        return _own_tokenizer(base, _base_kwargs(name_or_path, hub_kwargs))


def _own_tokenizer(name_or_path: str, hub_kwargs: dict[str, Any]) -> Any:
    """The tokenizer saved in ``name_or_path``; a published family's read with its native config (no prompt for
    remote code) and given the family's chat template when it has none. Raises ``OSError`` without one."""
    raw = read_json(name_or_path, CONFIG_FILE, hub_kwargs, required=False) or {}
    family = get_family(raw.get("model_type"))
    if family is not None:
        tokenizer = family.load_tokenizer(name_or_path, family.native_config(raw), hub_kwargs)
        if tokenizer is not None and not tokenizer.chat_template:
            tokenizer.chat_template = family.chat_template
    else:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **hub_kwargs)
    # transformers 5 builds a vocabulary-less tokenizer from the config when the files are missing.
    if tokenizer is None or not has_vocabulary(tokenizer):
        raise OSError(f"{name_or_path} has no tokenizer files (save the tokenizer beside the model)")
    return tokenizer


def read_adapter_defaults(name_or_path: str, hub_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What an adapter saved beside its weights (:data:`ADAPTER_DEFAULTS_FILE`): its diffusion description and
    decoding defaults, under their ``config.json`` keys; ``{}`` when it saved none."""
    return read_json(name_or_path, ADAPTER_DEFAULTS_FILE, hub_kwargs, required=False) or {}


def read_model_kind(name_or_path: str, **hub_kwargs: Any) -> tuple[bool, bool]:
    """``(is_block_causal, is_decoder)`` of a checkpoint, read from its config files without loading weights.

    What the decoding settings that depend on the model need (:meth:`DiffusionGenerationConfig.check_model`),
    so that a grid checks every model before its first generation. A ``peft`` adapter answers for its base
    model (or the description saved with it).
    """
    base = adapter_base_model(name_or_path, **hub_kwargs)
    if base is not None:
        saved = read_adapter_defaults(name_or_path, hub_kwargs)
        base_kind = read_model_kind(base, **_base_kwargs(name_or_path, hub_kwargs))
        if saved.get(DIFFUSION_KEY):
            return saved[DIFFUSION_KEY].get("attention") == "block_causal", base_kind[1]
        return base_kind
    raw = read_json(name_or_path, CONFIG_FILE, hub_kwargs, required=False) or {}
    family = get_family(raw.get("model_type"))
    if raw.get(DIFFUSION_KEY):
        attention = raw[DIFFUSION_KEY].get("attention")
    else:
        attention = family.attention if family is not None else "bidirectional"
    is_decoder = not any(arch.endswith("ForMaskedLM") for arch in raw.get("architectures") or [])
    return attention == "block_causal", is_decoder


def saved_decoding_defaults(
    name_or_path: str, **hub_kwargs: Any
) -> tuple[DiffusionGenerationConfig, int | None] | None:
    """The decoding defaults a checkpoint loads with, as ``AutoModelForDiffusionLM.from_pretrained`` picks them,
    and its attention block size (block-causal models; else ``None``), read from its config files alone: no
    weights, no tokenizer (whose stop ids change no check). ``None`` when its config cannot be read (a Hub id that
    is not in the cache, offline)."""
    base = adapter_base_model(name_or_path, **hub_kwargs)
    if base is not None:  # what the adapter saved (_load_adapter hands it to its base model), else the base's
        saved = read_adapter_defaults(name_or_path, hub_kwargs)
        found = saved_decoding_defaults(base, **_base_kwargs(name_or_path, hub_kwargs))
        generation = DiffusionGenerationConfig.parse(saved.get(GENERATION_KEY)) or (
            found[0] if found else None
        )
        diffusion = saved.get(DIFFUSION_KEY)
        if generation is None or (not diffusion and found is None):
            return None
        return generation, _block_size(diffusion) if diffusion else found[1]
    raw = read_json(name_or_path, CONFIG_FILE, hub_kwargs, required=False)
    if raw is None:
        return None
    family = get_family(raw.get("model_type"))
    if family is not None:  # a published checkpoint: its family's reference decoding, whatever it saved
        block_size = raw.get("block_size", family.block_size) if family.attention == "block_causal" else None
        return family.generation_config(raw), block_size
    generation = DiffusionGenerationConfig.parse(raw.get(GENERATION_KEY)) or DiffusionGenerationConfig()
    return generation, _block_size(raw.get(DIFFUSION_KEY) or {})


def _block_size(diffusion: dict[str, Any]) -> int | None:
    """The block size decoding defaults to, from a saved diffusion description (block-causal models only)."""
    return diffusion.get("block_size") if diffusion.get("attention") == "block_causal" else None


def check_pushable_adapter(model: Any) -> None:
    """Refuse to publish a ``peft`` adapter whose base model is a local folder: its ``adapter_config.json`` names
    the base by that path, which nobody who downloads the adapter has (peft writes it without a word)."""
    for config in (getattr(model, "peft_config", None) or {}).values():
        base = config.base_model_name_or_path
        if base and os.path.isdir(base):
            raise ValueError(
                f"push_to_hub: this adapter's base model is the local folder {base!r}, which its "
                f"{ADAPTER_CONFIG_FILE} would name and nobody who downloads it can load. Push the base model to "
                "the Hub first and train from its Hub id, or train without push_to_hub and publish the merged "
                "model (AutoModelForDiffusionLM.from_pretrained(adapter).merge_and_unload())"
            )


def remote_code_files(folder: str | os.PathLike) -> list[str]:
    """The ``.py`` files of a saved checkpoint's own code: the modules its ``config.json`` and
    ``tokenizer_config.json`` name in ``auto_map`` (``module.Class``), and the modules they import relatively."""
    from transformers.dynamic_module_utils import get_relative_import_files

    found: set[str] = set()
    for config_file in (CONFIG_FILE, "tokenizer_config.json"):
        auto_map = (read_json(str(folder), config_file, {}, required=False) or {}).get("auto_map") or {}
        for refs in auto_map.values():
            for ref in refs if isinstance(refs, list) else [refs]:
                # "repo--module.Class" is code in another repo: only files saved here travel with the folder.
                path = os.path.join(folder, str(ref or "").split("--")[-1].rpartition(".")[0] + ".py")
                if ref and os.path.isfile(path):
                    found.update([path, *get_relative_import_files(path)])
    return sorted(os.path.relpath(path, folder) for path in found)


def save_adapter_defaults(model: torch.nn.Module, folder: str | os.PathLike) -> None:
    """Write the diffusion description and decoding defaults of an adapter's model next to the adapter."""
    config = unwrap_model(model).config
    # Both are stored as plain dicts (``save_to_model_config``), the way config.json holds them.
    data = {key: getattr(config, key) for key in (DIFFUSION_KEY, GENERATION_KEY) if hasattr(config, key)}
    with open(os.path.join(folder, ADAPTER_DEFAULTS_FILE), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)


def _load_adapter(
    cls: type,
    name_or_path: str,
    base: str,
    diffusion_config: DiffusionConfig | dict | None,
    generation_config: DiffusionGenerationConfig | dict | None,
    use_remote_code: bool,
    hf_kwargs: dict[str, Any],
    peft_kwargs: dict[str, Any],
) -> torch.nn.Module:
    """Base model, then the adapter on it (peft's convention), with the decoding defaults saved with the adapter."""
    from peft import PeftModel

    hub_kwargs = {k: hf_kwargs[k] for k in _HUB_KWARGS if k in hf_kwargs}
    saved = read_adapter_defaults(name_or_path, hub_kwargs)
    base_kwargs = _base_kwargs(name_or_path, hf_kwargs)
    model = cls.from_pretrained(
        base,
        diffusion_config=diffusion_config if diffusion_config is not None else saved.get(DIFFUSION_KEY),
        generation_config=generation_config if generation_config is not None else saved.get(GENERATION_KEY),
        use_remote_code=use_remote_code,
        **base_kwargs,
    )
    adapter_kwargs = {
        k: hub_kwargs[k] for k in ("revision", "subfolder", "token", "cache_dir") if k in hub_kwargs
    }
    with without_checkpointing_deprecation():  # peft reads a deprecated transformers attribute
        return PeftModel.from_pretrained(model, name_or_path, **adapter_kwargs, **peft_kwargs)


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


def _family_defaults(
    family: ModelFamily,
    name_or_path: str,
    raw: dict[str, Any],
    config: Any,
    hub_kwargs: dict[str, Any],
    diffusion_config: DiffusionConfig | dict | None,
    generation_config: DiffusionGenerationConfig | dict | None,
) -> tuple[DiffusionConfig | dict, DiffusionGenerationConfig | dict]:
    """The family's diffusion description and decoding defaults, unless given; resolved before any weight loads."""
    tokenizer = None
    if generation_config is None or (diffusion_config is None and raw.get("mask_token_id") is None):
        tokenizer = family.load_tokenizer(name_or_path, config, hub_kwargs)
    if diffusion_config is None:
        diffusion_config = family.diffusion_config(raw, tokenizer)
    if generation_config is None:
        generation_json = read_json(name_or_path, GENERATION_CONFIG_FILE, hub_kwargs, required=False)
        generation_config = family.generation_config(raw, tokenizer, generation_json)
    return diffusion_config, generation_config


def _auto_class(raw: dict[str, Any], masked_lm: bool, remote_code: bool) -> type:
    """The Auto class that loads a checkpoint: its LM head's, or ``AutoModel`` for remote code registered under
    ``AutoModel`` only (Dream's published code; LLaDA's and SDAR's also register ``AutoModelForCausalLM``)."""
    wanted = AutoModelForMaskedLM if masked_lm else AutoModelForCausalLM
    auto_map = raw.get("auto_map") or {}
    if remote_code and wanted.__name__ not in auto_map and "AutoModel" in auto_map:
        return AutoModel
    return wanted


def _check_model_type(name_or_path: str, raw: dict[str, Any], trust_remote_code: bool) -> None:
    model_type = raw.get("model_type")
    if model_type is None or model_type in CONFIG_MAPPING or (trust_remote_code and raw.get("auto_map")):
        return
    raise ValueError(
        f"{name_or_path}: {CONFIG_FILE} has model_type {model_type!r}, which neither transformers nor t3d-trl "
        f"supports. t3d-trl maps the published families {sorted(FAMILIES)} onto native classes; any model_type "
        "transformers knows (llama, qwen2, qwen3, modernbert, ...) loads as it is; a checkpoint that ships its own "
        "modeling code needs trust_remote_code=True (the --trust_remote_code flag of the t3d-trl commands)."
    )


def _is_masked_lm(config: Any) -> bool:
    """An encoder MLM: its architecture says so, or (a bare encoder such as ``ModernBertModel``, a fresh config)
    transformers has a masked-LM head for its config and nothing calls it a decoder."""
    architectures = getattr(config, "architectures", None) or []
    if any(arch.endswith("ForMaskedLM") for arch in architectures):
        return True
    causal = any(arch.endswith(("ForCausalLM", "LMHeadModel")) for arch in architectures)
    return (
        type(config) in MODEL_FOR_MASKED_LM_MAPPING
        and not causal
        and not getattr(config, "is_decoder", False)
    )


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
        use_remote_code: bool = False,
        **hf_kwargs: Any,
    ) -> PreTrainedModel:
        """Load a checkpoint (local folder or Hub repo id) and attach :class:`DiffusionGenerationMixin`.

        Published LLaDA, SDAR and Dream checkpoints (``model_type`` ``llada``, ``sdar``, ``Dream``) load into
        native ``LlamaForCausalLM``, ``Qwen3ForCausalLM`` and ``Qwen2ForCausalLM`` without remote code, with the
        family's diffusion description and reference decoding defaults (see ``docs/families.md``).

        A ``peft`` adapter (a folder or repo with ``adapter_config.json``, as ``t3d-trl train --use_peft``
        writes) loads as peft does: its ``base_model_name_or_path`` first, then the adapter on it, returned as a
        ``PeftModel`` with ``diffusion_generate`` and the decoding defaults the adapter was trained for.
        ``model.merge_and_unload()`` folds the adapter in and returns a plain model to ``save_pretrained``. peft
        loads an adapter frozen, for inference: pass ``is_trainable=True`` to train it further.

        Args:
            pretrained_model_name_or_path: anything ``transformers`` can load, or a published family checkpoint.
            diffusion_config: overrides the description stored in the checkpoint. Needed for decoders that
                were never saved by t3d-trl; encoder MLMs default to bidirectional with the tokenizer's mask.
            generation_config: replaces the decoding defaults stored in the checkpoint (a dict is a whole
                config: fields it leaves out take the class defaults, not the saved ones). To change one saved
                default, pass ``model.diffusion_generation_config.update(...)`` back, or a keyword to
                ``diffusion_generate``.
            use_remote_code: run a family checkpoint's own published modeling code instead of the native class
                (needs ``trust_remote_code=True``). Fragile: that code targets older transformers releases.
            **hf_kwargs: passed to ``from_pretrained`` (``dtype``, ``revision``, ``device_map``, ...). For a
                ``peft`` adapter, peft's own keywords (``is_trainable``, ``adapter_name``,
                ``autocast_adapter_dtype``, ``ephemeral_gpu_offload``) go to ``PeftModel.from_pretrained``.
        """
        peft_kwargs = {k: hf_kwargs.pop(k) for k in _PEFT_KWARGS if k in hf_kwargs}
        hub_kwargs = {k: hf_kwargs[k] for k in _HUB_KWARGS if k in hf_kwargs}
        refused = sorted(k for k in ("output_loading_info", "config", "key_mapping") if hf_kwargs.get(k))
        if refused:  # a published family loads through a native config and key mapping of its own
            raise ValueError(
                f"{refused} are not supported by AutoModelForDiffusionLM.from_pretrained; pass config values as "
                "keywords (use_cache=False, ...) and load with transformers' own classes for the rest"
            )
        trust_remote_code = bool(hf_kwargs.get("trust_remote_code"))
        if use_remote_code and not trust_remote_code:
            raise ValueError(
                "use_remote_code=True runs the checkpoint's own modeling code: pass trust_remote_code=True too"
            )
        weights = not any(k in hf_kwargs for k in _OTHER_WEIGHTS_KWARGS)
        check_model_source(pretrained_model_name_or_path, weights=weights, **hub_kwargs)
        base = adapter_base_model(pretrained_model_name_or_path, **hub_kwargs)
        if base is not None:
            return _load_adapter(
                cls,
                pretrained_model_name_or_path,
                base,
                diffusion_config,
                generation_config,
                use_remote_code,
                hf_kwargs,
                peft_kwargs,
            )
        if peft_kwargs:
            raise ValueError(
                f"{sorted(peft_kwargs)} apply to a peft adapter ({ADAPTER_CONFIG_FILE}); "
                f"{pretrained_model_name_or_path} is a model"
            )
        raw = read_json(pretrained_model_name_or_path, CONFIG_FILE, hub_kwargs, required=False) or {}
        family = get_family(raw.get("model_type"))
        if family is not None:
            native = family.native_config(raw)  # validates the published config before anything loads
            # Config values given as keywords go onto the native config, as transformers applies them without one.
            for key in [k for k in hf_kwargs if k in native.to_dict() and k not in _LOADER_KWARGS]:
                setattr(native, key, hf_kwargs.pop(key))
            diffusion_config, generation_config = _family_defaults(
                family,
                pretrained_model_name_or_path,
                raw,
                native,
                hub_kwargs,
                diffusion_config,
                generation_config,
            )
            if use_remote_code:
                loader = _auto_class(raw, masked_lm=False, remote_code=True)
                model = loader.from_pretrained(pretrained_model_name_or_path, **hf_kwargs)
            else:
                # Names and shapes checked from the shard headers first, for errors naming file and tensor.
                locate_weights(pretrained_model_name_or_path, family, native, hub_kwargs)
                model = family.load_model(pretrained_model_name_or_path, native, **hf_kwargs)
            return add_diffusion_generation(model, diffusion_config, generation_config)
        _check_model_type(pretrained_model_name_or_path, raw, trust_remote_code)
        config = AutoConfig.from_pretrained(pretrained_model_name_or_path, **hub_kwargs)
        loader = _auto_class(raw, _is_masked_lm(config), trust_remote_code)
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
