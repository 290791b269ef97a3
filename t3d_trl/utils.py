"""Small helpers shared across stages."""

from __future__ import annotations

import os
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
    try:
        return datasets.load_dataset(builder, data_files={split: str(path)}, split=split)
    except (StopIteration, datasets.exceptions.DatasetGenerationError) as err:
        cause = err.__cause__ or err
        raise ValueError(f"cannot read data file {str(path)!r} as {builder}: {cause}") from err


def dataclass_from_dict(cls: type[T], data: dict[str, Any], what: str) -> T:
    """Build a config dataclass from a dict, refusing keys it does not know (named, with the known ones)."""
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown keys in {what}: {sorted(unknown)} (known: {sorted(known)})")
    return cls(**data)
