"""Cheap checks of checkpoint files before anything loads them: which weights files a folder has, and whether each
is whole (headers and sizes only), so that an interrupted copy or download is named in one line."""

from __future__ import annotations

import json
import os
import zipfile

from .families.base import CONFIG_FILE

#: The weights files transformers looks for in a model folder, in its order, and peft in an adapter folder.
MODEL_WEIGHTS_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
ADAPTER_WEIGHTS_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path``, a checkpoint file something will load, is damaged; ``None`` when it looks whole. Cheap: reads
    headers only. A ``.safetensors`` file must hold all the data its header describes; a torch-saved file
    (``.bin``, ``.pt``, ``.pth``: a zip archive whose directory is at its end) must end as a zip (older pickle
    files, which do not start as one, are not checked); a ``.json`` file must parse."""
    from safetensors import safe_open

    path = str(path)
    try:
        if path.endswith(".safetensors"):
            with safe_open(path, framework="pt"):
                pass
        elif path.endswith((".bin", ".pt", ".pth")):
            with open(path, "rb") as f:
                head = f.read(4)
            if not head:
                return f"{path} is damaged (empty)"
            if head == b"PK\x03\x04":
                with zipfile.ZipFile(path) as archive:
                    archive.infolist()
        elif path.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                json.load(f)
    except Exception as err:  # noqa: BLE001 - safetensors, zipfile and json each raise their own types (and OSError)
        return f"{path} is damaged ({type(err).__name__}: {' '.join(str(err).split())})"
    return None


def check_weights(folder: str, adapter: bool = False, complete: bool = True) -> None:
    """Fail, naming the file, when a local checkpoint folder has no weights file or a damaged one.

    Looks where transformers (peft, for an adapter) looks, in its order: ``model.safetensors``, a sharded
    ``model.safetensors.index.json`` and every shard it lists, then ``pytorch_model.bin`` (or its index); for an
    adapter ``adapter_model.safetensors`` or ``adapter_model.bin``. Only headers and sizes are read, so an
    interrupted copy or download is named here rather than failing with a traceback once loading starts.
    ``complete=False`` (a Hub snapshot in the cache while online, which the loader completes by downloading)
    checks only the files that are there.

    Raises:
        FileNotFoundError: no weights file, or a shard its index lists is missing.
        ValueError: a weights file (or index) is damaged.
    """
    names = ADAPTER_WEIGHTS_FILES if adapter else MODEL_WEIGHTS_FILES
    if not adapter:  # a config may name its own weights file (transformers' ``transformers_weights``)
        try:
            with open(os.path.join(folder, CONFIG_FILE), encoding="utf-8") as f:
                explicit = json.load(f).get("transformers_weights")
        except (OSError, ValueError, AttributeError):
            explicit = None  # a broken config.json: whatever reads it next reports it
        names = (explicit,) if isinstance(explicit, str) else names
    path = next((os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))), None)
    if path is None:
        if not complete:
            return
        raise FileNotFoundError(
            f"{folder} has no weights file (none of {', '.join(names)}): not a complete checkpoint"
        )
    files = [path]
    if path.endswith(".index.json"):
        try:
            with open(path, encoding="utf-8") as f:
                files = [os.path.join(folder, n) for n in dict.fromkeys(json.load(f)["weight_map"].values())]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{path} is damaged (no readable weight_map: {err})") from err
        missing = [file for file in files if not os.path.isfile(file)]
        if missing and complete:
            raise FileNotFoundError(f"{missing[0]} is missing (a shard {path} lists)")
        files = [file for file in files if file not in missing]
    for file in files:
        problem = file_problem(file)
        if problem is not None:
            raise ValueError(problem)
