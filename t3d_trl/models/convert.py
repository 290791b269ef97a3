"""Convert a published LLaDA, SDAR or Dream checkpoint into a native transformers checkpoint, shard by shard.

The result loads with plain ``AutoModelForCausalLM.from_pretrained(dst)`` (no remote code) and, with the
diffusion description and decoding defaults stored in its ``config.json``, ready to sample with
``AutoModelForDiffusionLM.from_pretrained(dst)``.

Memory: every shard header is read and checked against the native model's expected names and shapes before
anything is written; then tensors are streamed from the source shards into output shards of at most
``max_shard_size`` bytes, so about one output shard is held in memory at a time, never the whole model.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, PretrainedConfig
from transformers.utils.hub import convert_file_size_to_int

from ..utils import resolve_dtype
from .families import FAMILIES, ModelFamily, get_family
from .families.base import CONFIG_FILE, GENERATION_CONFIG_FILE, hub_file, read_json

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class WeightEntry:
    """One published tensor, located from its shard's header (nothing loaded)."""

    source: str  # published name
    target: str  # native name
    shard: str  # source shard file name
    shape: tuple[int, ...]
    dtype: torch.dtype


def convert_checkpoint(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    max_shard_size: int | str | None = None,
    dtype: torch.dtype | str | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
) -> Path:
    """Write a native transformers copy of a published LLaDA, SDAR or Dream checkpoint.

    Args:
        src: a local folder or Hub repo id holding the published checkpoint (safetensors, one file or sharded).
        dst: an empty or new folder for the converted checkpoint.
        max_shard_size: largest output shard, in bytes or as ``"5GB"``; ``None`` keeps the size of the largest
            source shard. The conversion holds about one output shard in memory.
        dtype: cast floating-point weights (``torch.bfloat16`` or ``"bfloat16"``); ``None`` keeps the source's.
            A cast also holds the cast copy of the output shard being written.
        revision, token: for Hub sources.

    Returns:
        ``dst`` as a path. It holds the native ``config.json`` (with the ``diffusion`` and ``diffusion_generation``
        keys), ``model.safetensors`` or ``model-0000i-of-0000n.safetensors`` shards with
        ``model.safetensors.index.json``, and the source's tokenizer files with the tokenizer's own code that
        ``tokenizer_config.json``'s ``auto_map`` names (plus the family's chat template when the tokenizer has
        none).

    Raises:
        ValueError: unknown ``model_type``; a config key the native class cannot express; a tokenizer without a
            mask token when ``config.json`` has no ``mask_token_id``; a tensor whose name has no native place, whose
            shape differs from what ``config.json`` implies, or that is missing; a tokenizer_config.json that is
            not JSON. Nothing is left in ``dst`` after any failure (it is written beside it, then renamed).
        FileNotFoundError: no ``config.json``, no safetensors weights, or a shard the index lists is absent.
        FileExistsError: ``dst`` is a non-empty folder.
    """
    src = str(src)
    dst = Path(dst)
    if dst.exists() and any(dst.iterdir()):
        raise FileExistsError(f"destination {dst} is not empty; choose a new folder")
    hub_kwargs = {k: v for k, v in (("revision", revision), ("token", token)) if v is not None}
    if not os.path.isdir(
        src
    ):  # a missing folder, or (offline) an uncached Hub id: named as from_pretrained does
        from .auto import check_model_source  # here: auto imports this module

        check_model_source(src, **hub_kwargs)
    raw = read_json(src, CONFIG_FILE, hub_kwargs)
    family = get_family(raw.get("model_type"))
    if family is None:
        raise ValueError(
            f"{src}: {CONFIG_FILE} has model_type {raw.get('model_type')!r}; convert_checkpoint knows the "
            f"published families {sorted(FAMILIES)}. Checkpoints transformers already knows need no conversion."
        )
    config = family.native_config(raw)
    dtype = None if dtype == "auto" else dtype  # the source's, as None
    if dtype is not None:
        dtype = config.dtype = resolve_dtype(dtype)
    tokenizer = family.load_tokenizer(src, config, hub_kwargs)
    family.diffusion_config(raw, tokenizer).save_to_model_config(config)
    generation_json = read_json(src, GENERATION_CONFIG_FILE, hub_kwargs, required=False)
    family.generation_config(raw, tokenizer, generation_json).save_to_model_config(config)

    shard_paths, tensors = locate_weights(src, family, config, hub_kwargs)
    largest = max(os.path.getsize(path) for path in shard_paths.values())
    limit = convert_file_size_to_int(max_shard_size) if max_shard_size is not None else largest
    groups = _group(tensors, limit, dtype)

    # Written beside dst and renamed into place when whole: a failure (a bad tokenizer file, a full disk) never
    # leaves a folder that looks converted and blocks the rerun (a kill leaves only the hidden staging folder).
    staging = dst.parent / f".{dst.name}.converting-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        _write_shards(groups, shard_paths, staging, dtype)
        config.save_pretrained(staging)
        _copy_tokenizer(src, hub_kwargs, staging, family)
        if dst.exists():
            dst.rmdir()  # empty, checked above
        staging.rename(dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dst


def locate_weights(
    src: str, family: ModelFamily, config: PretrainedConfig, hub_kwargs: Mapping[str, Any]
) -> tuple[dict[str, str], list[WeightEntry]]:
    """Find a published checkpoint's shards and check every tensor against the native model of ``config``.

    Only the shard headers are read. Returns ``(shard file name -> local path, tensors in source order)``;
    raises, naming the file and the tensor, on a missing shard, a tensor with no native place, a shape that
    differs from what ``config.json`` implies, or a missing weight.
    """
    shard_paths = _source_shards(src, hub_kwargs)
    return shard_paths, _plan(family, config, shard_paths)


def _source_shards(src: str, hub_kwargs: Mapping[str, Any]) -> dict[str, str]:
    """Source shard file name -> local path, in the index's order; a listed but absent shard raises."""
    index = read_json(src, INDEX_FILE, hub_kwargs, required=False)
    if index is None:
        path = hub_file(src, SINGLE_FILE, hub_kwargs, required=False)
        if path is None:
            raise FileNotFoundError(
                f"{src} has neither {INDEX_FILE} nor {SINGLE_FILE}: published LLaDA, SDAR and Dream weights are "
                "read from safetensors files only (not pytorch_model.bin)"
            )
        return {SINGLE_FILE: path}
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{src}: {INDEX_FILE} has no 'weight_map'")
    paths = {}
    for name in dict.fromkeys(weight_map.values()):
        try:
            paths[name] = hub_file(src, name, hub_kwargs)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{src}: shard {name} listed in {INDEX_FILE} is missing ({err})") from err
    return paths


def _expected_shapes(config: PretrainedConfig) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the native model's weights, from a model built on the meta device (no memory)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)  # stored once, as the input embedding
    return shapes


def _plan(family: ModelFamily, config: PretrainedConfig, shard_paths: Mapping[str, str]) -> list[WeightEntry]:
    """Read every shard header and check names and shapes against the native model before writing anything."""
    expected = _expected_shapes(config)
    native = config.architectures[0]
    tensors: list[WeightEntry] = []
    seen: dict[str, str] = {}
    for shard, path in shard_paths.items():
        with safe_open(path, framework="pt") as f:
            for key in sorted(f.keys()):
                target = family.rename(key)
                part = f.get_slice(key)
                shape = tuple(part.get_shape())
                if target not in expected:
                    if target == "lm_head.weight" and getattr(config, "tie_word_embeddings", False):
                        continue  # a redundant copy of a tied head
                    raise ValueError(
                        f"{shard}: tensor {key!r} (native name {target!r}) has no place in {native} built from "
                        f"{CONFIG_FILE}"
                    )
                if target in seen:
                    raise ValueError(
                        f"{shard}: tensor {key!r} maps to {target!r}, already given by {seen[target]}"
                    )
                if shape != expected[target]:
                    raise ValueError(
                        f"{shard}: tensor {key!r} has shape {list(shape)} but {CONFIG_FILE} implies "
                        f"{list(expected[target])} for {target!r} in {native}; the config's sizes do not match "
                        "the weights"
                    )
                seen[target] = f"{shard}:{key}"
                tensors.append(WeightEntry(key, target, shard, shape, _ST_DTYPES[part.get_dtype()]))
    missing = sorted(set(expected) - set(seen))
    if missing:
        raise ValueError(
            f"the checkpoint lacks {len(missing)} weight(s) that {native} built from {CONFIG_FILE} needs: "
            f"{missing[:5]}{' ...' if len(missing) > 5 else ''}"
        )
    return tensors


def _nbytes(tensor: WeightEntry, dtype: torch.dtype | None) -> int:
    out = dtype if dtype is not None and tensor.dtype.is_floating_point else tensor.dtype
    return torch.Size(tensor.shape).numel() * out.itemsize


def _group(tensors: list[WeightEntry], limit: int, dtype: torch.dtype | None) -> list[list[WeightEntry]]:
    """Split tensors, in source order, into output shards of at most ``limit`` bytes (a bigger tensor gets its own)."""
    groups: list[list[WeightEntry]] = [[]]
    size = 0
    for tensor in tensors:
        nbytes = _nbytes(tensor, dtype)
        if groups[-1] and size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(tensor)
        size += nbytes
    return groups


def _write_shards(
    groups: list[list[WeightEntry]], shard_paths: Mapping[str, str], dst: Path, dtype: torch.dtype | None
) -> None:
    total = len(groups)
    names = (
        [SINGLE_FILE]
        if total == 1
        else [f"model-{i:05d}-of-{total:05d}.safetensors" for i in range(1, total + 1)]
    )
    weight_map: dict[str, str] = {}
    total_size = 0
    for name, group in zip(tqdm(names, desc="converting", unit="shard"), groups):
        # safetensors tensors are views of the shard's memory map: opening the sources per output shard and
        # dropping everything after writing it unmaps their pages, so only about one output shard is resident.
        handles: dict[str, Any] = {}
        out: dict[str, torch.Tensor] = {}
        for tensor in group:
            if tensor.shard not in handles:
                handles[tensor.shard] = safe_open(shard_paths[tensor.shard], framework="pt")
            value = handles[tensor.shard].get_tensor(tensor.source)
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
            out[tensor.target] = value.contiguous()
            weight_map[tensor.target] = name
            total_size += value.numel() * value.element_size()
        save_file(out, dst / name, metadata={"format": "pt"})
        del out, value, handles
    if total > 1:
        index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
        (dst / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _tokenizer_code_files(tokenizer_config: Mapping[str, Any]) -> list[str]:
    """The ``.py`` files holding a tokenizer's own code, named by ``tokenizer_config.json``'s ``auto_map``
    (``{"AutoTokenizer": [slow, fast]}``, e.g. ``tokenization_dream.DreamTokenizer``); code in another repo
    (``repo--module.Class``) is not the checkpoint's to copy."""
    auto_map = tokenizer_config.get("auto_map") or {}
    # Older tokenizers store the bare [slow, fast] list.
    entries = auto_map.values() if isinstance(auto_map, Mapping) else [auto_map]
    refs = [ref for entry in entries for ref in (entry if isinstance(entry, (list, tuple)) else [entry])]
    return list(dict.fromkeys(f"{ref.rsplit('.', 1)[0]}.py" for ref in refs if ref and "--" not in ref))


def _copy_tokenizer(src: str, hub_kwargs: Mapping[str, Any], dst: Path, family: ModelFamily) -> None:
    copied = []
    for name in TOKENIZER_FILES:
        path = hub_file(src, name, hub_kwargs, required=False)
        if path is not None:
            shutil.copyfile(path, dst / name)
            copied.append(name)
    if not copied:
        logger.warning("%s has no tokenizer files; %s has weights and config only", src, dst)
        return
    config_path = dst / "tokenizer_config.json"
    try:
        tokenizer_config = json.loads(config_path.read_text()) if config_path.exists() else {}
    except json.JSONDecodeError as err:
        raise ValueError(f"{src}: {config_path.name} is not valid JSON ({err})") from err
    # With its code the tokenizer loads with trust_remote_code=True, as the source's does.
    for name in _tokenizer_code_files(tokenizer_config):
        path = hub_file(src, name, hub_kwargs, required=False)
        if path is None:
            logger.warning(
                "%s: %s names %s in its auto_map, but there is no such file", src, config_path.name, name
            )
        else:
            shutil.copyfile(path, dst / name)
    template_files = {"chat_template.jinja", "chat_template.json"} & set(copied)
    if not template_files and not tokenizer_config.get("chat_template"):
        (dst / "chat_template.jinja").write_text(family.chat_template)
