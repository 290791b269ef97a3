"""Published diffusion-LM families that load onto native transformers classes without remote code.

The registry is keyed by the ``model_type`` of the published ``config.json``.
"""

from __future__ import annotations

from .base import ModelFamily
from .dream import DREAM
from .llada import LLADA
from .sdar import SDAR

FAMILIES: dict[str, ModelFamily] = {
    model_type: family for family in (LLADA, SDAR, DREAM) for model_type in family.model_types
}


def get_family(model_type: str | None) -> ModelFamily | None:
    """The family of a published ``model_type`` (``"llada"``, ``"sdar"``, ``"Dream"``), or ``None``."""
    return FAMILIES.get(model_type) if model_type is not None else None


__all__ = ["DREAM", "FAMILIES", "LLADA", "SDAR", "ModelFamily", "get_family"]
