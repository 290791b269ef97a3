"""What t3d-trl needs to know to run a published diffusion-LM family on a native transformers class.

A published checkpoint (LLaDA, SDAR, Dream) ships a ``config.json`` whose ``model_type`` transformers does not
know, plus modeling code meant for ``trust_remote_code``. A :class:`ModelFamily` replaces that code with facts:
how the published config maps onto a native config (``LlamaConfig``, ``Qwen3Config``, ``Qwen2Config``), how
the published weight names map onto the native ones, and how the model is decoded (mask token, attention
kind, logit shift, stop tokens, chat template, reference decoding settings).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from transformers import AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from transformers.utils import cached_file

from ...diffusion.config import DiffusionConfig
from ...generation.configuration import DiffusionGenerationConfig

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
# ``from_pretrained`` keywords that locate files (the subset ``cached_file`` understands).
FILE_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "subfolder", "force_download", "proxies")


def hub_file(
    name_or_path: str, filename: str, hub_kwargs: Mapping[str, Any], required: bool = True
) -> str | None:
    """Local path of ``filename`` in a folder or Hub repo (downloaded if needed); ``None`` if optional and absent."""
    kwargs = {k: v for k, v in hub_kwargs.items() if k in FILE_KWARGS}
    try:
        path = cached_file(name_or_path, filename, _raise_exceptions_for_missing_entries=False, **kwargs)
    except OSError as err:
        if required:
            raise FileNotFoundError(f"{name_or_path}: cannot read {filename} ({err})") from err
        return None
    if path is None and required:
        raise FileNotFoundError(f"{name_or_path} has no file named {filename}")
    return path


def read_json(
    name_or_path: str, filename: str, hub_kwargs: Mapping[str, Any], required: bool = True
) -> dict[str, Any] | None:
    """A JSON file of a checkpoint as a plain dict (``AutoConfig`` cannot read unknown ``model_type`` values)."""
    path = hub_file(name_or_path, filename, hub_kwargs, required)
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{name_or_path}: {filename} is not valid JSON ({err})") from err


def require(raw: Mapping[str, Any], keys: Iterable[str]) -> None:
    """Raise, naming them, if required keys of a published ``config.json`` are missing."""
    missing = [key for key in keys if raw.get(key) is None]
    if missing:
        raise ValueError(
            f"{CONFIG_FILE} (model_type={raw.get('model_type')!r}) lacks required key(s) {missing}"
        )


def take(raw: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The listed keys of a published config that are present (anything else, e.g. training knobs, is dropped)."""
    return {key: raw[key] for key in keys if key in raw}


def check_supported(raw: Mapping[str, Any], supported: Mapping[str, Iterable[Any]], native: str) -> None:
    """Refuse published options the native class cannot express, naming the key and the accepted values."""
    for key, allowed in supported.items():
        allowed = tuple(allowed)
        if key in raw and raw[key] not in allowed:
            raise ValueError(
                f"{CONFIG_FILE} key {key!r}={raw[key]!r} is not supported by the {native} mapping "
                f"(supported: {list(allowed)})"
            )


def rope_parameters(raw: Mapping[str, Any], default_theta: float = 10000.0) -> dict[str, Any]:
    """transformers 5 ``rope_parameters`` from the published ``rope_theta`` and ``rope_scaling`` keys."""
    scaling = dict(raw.get("rope_scaling") or {})
    if "type" in scaling:  # the pre-``rope_type`` spelling
        scaling.setdefault("rope_type", scaling.pop("type"))
    scaling.setdefault("rope_type", "default")
    return {**scaling, "rope_theta": float(raw.get("rope_theta", default_theta))}


def as_id_list(value: Any) -> list[int]:
    """An id, a list of ids or ``None`` as a list of ints."""
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def vocab_id(tokenizer: Any, token: str) -> int | None:
    """Id of ``token`` when the tokenizer knows it as a whole token."""
    if tokenizer is None or not token:
        return None
    token_id = tokenizer.get_vocab().get(token)
    return None if token_id is None else int(token_id)


@dataclass(frozen=True)
class ModelFamily:
    """One published diffusion-LM family and its mapping onto a native transformers class.

    Args:
        name: display name (``"LLaDA"``).
        model_types: the ``model_type`` values of its published ``config.json``.
        map_config: published config dict -> native transformers config (sizes, RoPE, norms, special ids).
        attention: attention the model was trained with (``bidirectional`` or ``block_causal``).
        block_size: block size of a block-causal family; read from ``config.json`` key ``block_size`` if there.
        shift_logits: token ``i`` is predicted at position ``i - 1`` (Dream).
        mask_tokens: spellings of the mask token in the published tokenizer, used when ``config.json`` has no
            ``mask_token_id`` and the tokenizer declares no mask token.
        end_of_turn_tokens: tokens that end an assistant turn; added to the stop ids when the tokenizer has them.
        generation_defaults: :class:`DiffusionGenerationConfig` fields of the family's reference decoding. A
            block-causal family leaves ``block_length`` out, so that it decodes in blocks of its ``block_size``.
        chat_template: the family's chat template (Jinja), for tokenizers that lack one.
        key_mapping: published -> native weight names, as anchored regular expressions with at most one group
            (``from_pretrained(key_mapping=...)`` semantics); empty when the names already match.
    """

    name: str
    model_types: tuple[str, ...]
    map_config: Callable[[Mapping[str, Any]], PretrainedConfig]
    attention: Literal["bidirectional", "block_causal"]
    mask_tokens: tuple[str, ...]
    end_of_turn_tokens: tuple[str, ...]
    generation_defaults: Mapping[str, Any]
    chat_template: str
    block_size: int | None = None
    shift_logits: bool = False
    key_mapping: Mapping[str, str] = field(default_factory=dict)

    def rename(self, key: str) -> str:
        """Native name of a published weight (the first matching pattern of :attr:`key_mapping` applies)."""
        for pattern, replacement in self.key_mapping.items():
            renamed, count = re.subn(pattern, replacement, key, count=1)
            if count:
                return renamed
        return key

    def native_config(self, raw: Mapping[str, Any]) -> PretrainedConfig:
        """The native config of a published ``config.json``, keeping ``mask_token_id`` as an extra key."""
        config = self.map_config(raw)
        dtype = raw.get("dtype", raw.get("torch_dtype"))
        if dtype is not None:
            config.dtype = dtype
        if raw.get("mask_token_id") is not None:
            config.mask_token_id = int(raw["mask_token_id"])
        config.architectures = [_causal_lm_class(config).__name__]
        return config

    def load_tokenizer(
        self, name_or_path: str, config: PretrainedConfig, hub_kwargs: Mapping[str, Any]
    ) -> Any:
        """The checkpoint's tokenizer, or ``None`` (with a warning) when it cannot be loaded.

        The native ``config`` is passed so that transformers does not read the published ``config.json``
        (whose ``auto_map`` would ask for remote code).
        """
        try:
            # An explicit trust_remote_code=False fails fast instead of prompting for a tokenizer's own code.
            kwargs = {**hub_kwargs, "trust_remote_code": bool(hub_kwargs.get("trust_remote_code", False))}
            tokenizer = AutoTokenizer.from_pretrained(name_or_path, config=config, **kwargs)
        except Exception as err:  # noqa: BLE001  any tokenizer failure: fall back to the configs
            reason = str(err)
        else:
            # Without tokenizer files transformers 5 builds the config's tokenizer class from scratch: special
            # tokens only, no vocabulary.
            if has_vocabulary(tokenizer):
                return tokenizer
            reason = "no tokenizer files: the tokenizer has no vocabulary"
        logger.warning(
            "%s: tokenizer not loaded (%s); end-of-turn stop ids are skipped", name_or_path, reason
        )
        return None

    def mask_token_id(self, raw: Mapping[str, Any], tokenizer: Any = None) -> int:
        """The mask id: ``config.json``'s ``mask_token_id``, else the tokenizer's mask token or known spelling."""
        if raw.get("mask_token_id") is not None:
            return int(raw["mask_token_id"])
        candidates = [getattr(tokenizer, "mask_token", None), *self.mask_tokens]
        for token in candidates:
            token_id = vocab_id(tokenizer, token)
            if token_id is not None:
                return token_id
        where = "no tokenizer could be loaded" if tokenizer is None else "its tokenizer has no mask token"
        raise ValueError(
            f"{self.name} checkpoint: {CONFIG_FILE} has no 'mask_token_id' and {where} (looked for the "
            f"tokenizer's mask_token and {list(self.mask_tokens)}); add 'mask_token_id' to {CONFIG_FILE} or "
            "pass diffusion_config=DiffusionConfig(mask_token_id=...)"
        )

    def diffusion_config(self, raw: Mapping[str, Any], tokenizer: Any = None) -> DiffusionConfig:
        """How the family runs as a diffusion LM (mask id, attention kind, block size, logit shift)."""
        block_size = raw.get("block_size", self.block_size) if self.attention == "block_causal" else None
        return DiffusionConfig(
            mask_token_id=self.mask_token_id(raw, tokenizer),
            attention=self.attention,
            block_size=block_size,
            shift_logits=self.shift_logits,
        )

    def generation_config(
        self,
        raw: Mapping[str, Any],
        tokenizer: Any = None,
        generation_json: Mapping[str, Any] | None = None,
    ) -> DiffusionGenerationConfig:
        """The family's reference decoding with its stop ids.

        Stop ids are the config's EOS, then ``generation_config.json``'s, then the end-of-turn tokens the
        tokenizer knows; the pad id (written after a finished completion) is the config's ``pad_token_id``.
        """
        stops = as_id_list(raw.get("eos_token_id")) + as_id_list((generation_json or {}).get("eos_token_id"))
        stops += [i for i in (vocab_id(tokenizer, t) for t in self.end_of_turn_tokens) if i is not None]
        stops = list(dict.fromkeys(stops))
        pad = raw.get("pad_token_id")
        return DiffusionGenerationConfig(
            **self.generation_defaults,
            eos_token_id=stops or None,
            pad_token_id=int(pad) if pad is not None else (stops[0] if stops else None),
        )

    def load_model(self, name_or_path: str, config: PretrainedConfig, **hf_kwargs: Any) -> PreTrainedModel:
        """Load the published weights into the native class of ``config`` (see :meth:`native_config`).

        Raises if a native weight is missing, a published weight has no native place, or a shape differs.
        """
        hf_kwargs.pop("output_loading_info", None)
        hf_kwargs.pop("trust_remote_code", None)
        model, info = AutoModelForCausalLM.from_pretrained(
            name_or_path,
            config=config,
            key_mapping=dict(self.key_mapping) or None,
            output_loading_info=True,
            **hf_kwargs,
        )
        problems = {
            k: sorted(info.get(k) or ()) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")
        }
        problems = {k: v for k, v in problems.items() if v}
        if problems:
            details = "; ".join(f"{k}: {v[:5]}{' ...' if len(v) > 5 else ''}" for k, v in problems.items())
            raise ValueError(
                f"{name_or_path}: the {self.name} weights do not fit the native {type(model).__name__} built "
                f"from {CONFIG_FILE} ({details})"
            )
        # transformers would undo the renames on save_pretrained, writing published names under a native config.
        model._weight_conversions = []
        return model


def has_vocabulary(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` knows more than its special tokens (transformers 5 builds a tokenizer of special
    tokens alone from a config when a folder has no tokenizer files)."""
    return not set(tokenizer.get_vocab()) <= set(tokenizer.all_special_tokens)


def _causal_lm_class(config: PretrainedConfig) -> type:
    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
