"""Small helpers shared across stages."""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class MissingKeyError(KeyError, ValueError):
    """A name the input lacks (a column, a benchmark): a ``KeyError`` to code that looks names up, and a
    ``ValueError`` (bad input) to the command line, which reports it in one line."""

    def __str__(self) -> str:  # KeyError's str() would quote the whole message
        return str(self.args[0]) if self.args else ""


#: Local data files ``datasets.load_dataset`` reads, by suffix.
DATA_FILE_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}


def load_data_folder(path: str | os.PathLike, split: str = "train") -> Any:
    """A local folder of data files as ``datasets.load_dataset`` reads it; a folder it cannot read as a dataset
    (say, a model folder passed by mistake) raises ``ValueError`` naming it instead of ``datasets``' traceback."""
    import datasets

    return _read_dataset(
        f"the folder {str(path)!r} as a dataset", datasets.load_dataset, str(path), split=split
    )


def _read_dataset(what: str, load: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``load(*args, **kwargs)``, with datasets' failures to parse the data as one ``ValueError`` naming ``what``."""
    import datasets
    import pyarrow

    try:
        return load(*args, **kwargs)
    except (StopIteration, datasets.exceptions.DatasetGenerationError, pyarrow.ArrowException) as err:
        raise ValueError(f"cannot read {what}: {err.__cause__ or err}") from err


def load_data_file(path: str | os.PathLike, split: str = "train") -> Any:
    """A local ``.json``/``.jsonl``/``.parquet``/``.csv``/``.arrow`` file as a ``datasets.Dataset``.

    A missing file raises ``FileNotFoundError``; an unknown suffix, an empty file or one ``datasets`` cannot
    parse raises ``ValueError``; each names the file (``datasets`` itself would look for it on the Hub, or
    fail with ``StopIteration``).
    """
    import datasets

    path = Path(path)
    builder = DATA_FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ValueError(
            f"cannot read {str(path)!r}: unsupported data file, use one of {sorted(DATA_FILE_BUILDERS)}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    if not path.read_bytes().strip():
        raise ValueError(f"data file {str(path)!r} is empty")
    return _read_dataset(
        f"data file {str(path)!r} as {builder}",
        datasets.load_dataset,
        builder,
        data_files={split: str(path)},
        split=split,
    )


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write`` on a staging file beside ``path``, then move it into place: ``path`` is either complete or
    untouched. The staging name ``.<name>.<pid>.tmp`` is per process, so that writers racing on one ``path`` never
    move each other's staging file away (the last move wins)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)


def dataclass_from_dict(cls: type[T], data: dict[str, Any], what: str) -> T:
    """Build a config dataclass from a dict, refusing keys it does not know (named, with the known ones)."""
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown keys in {what}: {sorted(unknown)} (known: {sorted(known)})")
    return cls(**data)


# Where launchers put the number of processes they started: torchrun/accelerate, Intel MPI, Open MPI, MVAPICH.
_WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
CPU_PROCESSES_HELP = (
    "For N CPU processes run `torchrun --nproc_per_node N -m t3d_trl.cli.main <command> ...` or `accelerate launch` "
    "with a MULTI_GPU config (docs/recipes.md#several-cpu-processes)"
)


def resolve_dtype(dtype: Any) -> Any:
    """A weights dtype as given by a user: ``"auto"`` and ``None`` as they are, a name (``"bfloat16"``) or a
    ``torch.dtype`` as the ``torch.dtype``. Only the dtypes a model's weights can be cast to are accepted (float8
    needs scales); anything else is refused here, before a model loads, in one message."""
    if dtype is None or dtype == "auto":
        return dtype
    import torch

    resolved = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if resolved not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise ValueError(
            f"dtype must be 'auto' or a floating-point torch dtype such as 'bfloat16', got {dtype!r}"
        )
    return resolved


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a container or ``taskset`` narrows;
    ``os.cpu_count()`` counts the whole machine), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def launched_processes() -> int:
    """How many processes a launcher (torchrun, accelerate, MPI) says it started; 1 without one."""
    return max(int(os.environ.get(name) or 1) for name in _WORLD_SIZE_VARIABLES)


def check_process_count(world_size: int, what: str, consequence: str) -> None:
    """Refuse a run that a launcher started as N processes but that runs as fewer.

    Two cases are caught, both silent otherwise: the launcher started N processes that did not join one group
    (each would do the whole job on its own: ``consequence``), and ``accelerate launch --num_processes N`` on a
    machine without GPUs (or with ``--cpu``), which starts a single process unless it runs under ``mpirun``. That
    process still gets the ``MASTER_ADDR`` of the group accelerate meant to form, and no rank (``LOCAL_RANK``).
    """
    requested = launched_processes()
    if requested > world_size:
        raise ValueError(
            f"{what} was launched as {requested} processes but runs as {world_size}: {consequence}. "
            f"{CPU_PROCESSES_HELP}"
        )
    by_accelerate = "ACCELERATE_USE_CPU" in os.environ  # set by accelerate's one-process (and MPI) launcher
    if world_size == 1 and by_accelerate and "MASTER_ADDR" in os.environ and "LOCAL_RANK" not in os.environ:
        raise ValueError(
            f"`accelerate launch` was asked for several processes but started one ({what} would run as a single "
            "process; without GPUs accelerate starts several processes only under mpirun). "
            f"{CPU_PROCESSES_HELP}, or unset MASTER_ADDR to run one process"
        )


@contextmanager
def without_checkpointing_deprecation() -> Iterator[None]:
    """Silence transformers' ``is_gradient_checkpointing is deprecated`` FutureWarning for the calls inside.

    peft (``get_peft_model``, ``PeftModel.from_pretrained``) and TRL (``disable_gradient_checkpointing``) still
    read the old attribute; a user cannot act on the warning our calls into them raise, so it is not shown.
    Any other warning is.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing.*deprecated", category=FutureWarning
        )
        yield


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A package's PEP 562 ``__getattr__``: ``exports`` maps a public name to the module (relative to
    ``package``) that defines it, imported on first use so that importing the package stays light."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = sys.modules[package]
        value = getattr(importlib.import_module(exports[name], package), name)
        setattr(module, name, value)  # later lookups skip this function
        return value

    return __getattr__
