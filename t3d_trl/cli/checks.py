"""Checks the commands run on their inputs before loading anything, so that a mistake costs one line, not a load.

Each raises ``FileNotFoundError`` or ``ValueError`` naming the input, which the dispatcher prints as
``t3d-trl <command>: <message>`` with exit status 2.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..utils import DATA_FILE_BUILDERS


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_DATASETS_OFFLINE", "").lower() in (
        "1",
        "true",
    )


def _dataset_cached(repo_id: str) -> bool:
    """Whether a Hub dataset has a copy in the Hub cache or in the ``datasets`` cache (what offline loading reads)."""
    from huggingface_hub import constants

    hub = Path(constants.HF_HUB_CACHE) / f"datasets--{repo_id.replace('/', '--')}"
    datasets_cache = Path(
        os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets"
    ) / repo_id.replace("/", "___")
    return hub.is_dir() or datasets_cache.is_dir()


def check_dataset_source(name: str, what: str = "dataset_name") -> None:
    """A local data file or folder that exists, or a valid Hub dataset id (offline: one in the local cache).

    ``datasets`` would otherwise report a mistyped folder as a failed connection to the Hub, with a traceback.
    """
    if name.startswith("demo:"):  # a demo task by name (collect)
        from ..demo.tasks import DEMO_TASKS

        if name[5:] not in DEMO_TASKS:
            raise ValueError(f"{what}: unknown demo task {name[5:]!r}; available: {sorted(DEMO_TASKS)}")
        return
    path = Path(name)
    if path.suffix.lower() in DATA_FILE_BUILDERS and not path.is_dir():
        if not path.is_file():
            raise FileNotFoundError(f"{what}: data file {name!r} does not exist")
        return
    if path.is_dir():
        return
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as err:
        raise FileNotFoundError(
            f"{what}: {name!r} is no file or folder (nor a valid Hub dataset id)"
        ) from err
    if name.startswith((".", "/", "~")):
        raise FileNotFoundError(f"{what}: no such file or folder {name!r}")
    if _offline() and not _dataset_cached(name):
        raise FileNotFoundError(
            f"{what}: {name!r} is no local file or folder, and offline (HF_HUB_OFFLINE=1) the Hub dataset "
            f"{name!r} is not in the local cache"
        )


# accelerate's distributed_type -> (what it needs, importable module, pip package)
_BACKENDS = {"DEEPSPEED": ("DeepSpeed", "deepspeed", "deepspeed")}


def _has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available() or any(
        getattr(torch, name, None) is not None and getattr(torch, name).is_available()
        for name in ("xpu", "npu")
    )


def check_accelerate_config(path: str) -> None:
    """The ``accelerate`` config exists, and its DeepSpeed/FSDP backend is installed on this machine."""
    import yaml

    if not os.path.isfile(path):
        raise FileNotFoundError(f"accelerate_config {path!r} is not a file")
    with open(path, encoding="utf-8") as f:
        try:
            config = yaml.safe_load(f) or {}
        except yaml.YAMLError as err:
            raise ValueError(f"accelerate_config {path!r} is not valid YAML: {err}") from err
    kind = str(config.get("distributed_type", "")).upper() if isinstance(config, dict) else ""
    if kind in _BACKENDS:
        what, module, package = _BACKENDS[kind]
        if importlib.util.find_spec(module) is None:
            raise ValueError(
                f"accelerate_config {path!r} runs {what}, but the package {package!r} is not installed: "
                f"pip install {package}, or pass --accelerate_config '' to train in one process"
            )
    if kind == "FSDP":
        import torch.distributed

        if not torch.distributed.is_available():
            raise ValueError(
                f"accelerate_config {path!r} runs FSDP, but this torch build has no torch.distributed: install "
                "a torch with distributed support, or pass --accelerate_config '' to train in one process"
            )
    if kind in ("FSDP", "DEEPSPEED") and (config.get("use_cpu") or not _has_accelerator()):
        what = "FSDP" if kind == "FSDP" else "DeepSpeed"
        raise ValueError(
            f"accelerate_config {path!r} runs {what}, which accelerate sets up on GPUs only: on CPU processes "
            "every process would hold the whole model. Use a MULTI_GPU config such as recipes/accelerate/ddp.yaml "
            "(plain data parallel) on CPUs, or pass --accelerate_config '' to train in one process"
        )
