"""Small helpers shared across stages."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def dataclass_from_dict(cls: type[T], data: dict[str, Any], what: str) -> T:
    """Build a config dataclass from a dict, refusing keys it does not know (named, with the known ones)."""
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown keys in {what}: {sorted(unknown)} (known: {sorted(known)})")
    return cls(**data)
