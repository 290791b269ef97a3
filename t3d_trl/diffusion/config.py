"""How a checkpoint is run as a masked diffusion language model.

A :class:`DiffusionConfig` is the small, serialisable description that the sampler, the collator and the
trainer read: which token is the mask, which attention pattern the model was trained with, and whether
its logits are shifted by one position (Dream). It is stored in the model's ``config.json`` under the key
``"diffusion"``, so a checkpoint saved with ``save_pretrained`` (or pushed to the Hub) loads ready to sample.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from ..utils import dataclass_from_dict

CONFIG_KEY = "diffusion"
ATTENTION_KINDS = ("bidirectional", "block_causal")


@dataclass
class DiffusionConfig:
    """Description of a model used as a masked diffusion LM.

    Args:
        mask_token_id: id of the mask token that marks positions still to be decoded.
        attention: ``"bidirectional"`` (LLaDA, Dream, BERT-style MLMs: every position sees every other) or
            ``"block_causal"`` (SDAR: a position sees its own block and all earlier blocks).
        block_size: the attention block size of a block-causal model (SDAR: 4), also its default decoding
            block length. ``None`` for bidirectional models (decoding ignores it there: their block length is
            the generation config's ``block_length``).
        shift_logits: ``True`` when token ``i`` is predicted at position ``i - 1`` (Dream, a leftover of its
            autoregressive initialisation).
    """

    mask_token_id: int
    attention: Literal["bidirectional", "block_causal"] = "bidirectional"
    block_size: int | None = None
    shift_logits: bool = False

    def __post_init__(self) -> None:
        if (
            not isinstance(self.mask_token_id, int)
            or isinstance(self.mask_token_id, bool)
            or self.mask_token_id < 0
        ):
            raise ValueError(f"mask_token_id must be a non-negative int, got {self.mask_token_id!r}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        # A hand-written value of the wrong type would be truthy or compare oddly far from here ('false', 2.5).
        if self.block_size is not None and (
            not isinstance(self.block_size, int) or isinstance(self.block_size, bool)
        ):
            raise ValueError(f"block_size must be an int or None, got {self.block_size!r}")
        if not isinstance(self.shift_logits, bool):
            raise ValueError(f"shift_logits must be a bool, got {self.shift_logits!r}")
        if self.attention == "block_causal":
            if self.block_size is None or self.block_size < 1:
                raise ValueError(
                    f"a block_causal model needs a positive block_size, got block_size={self.block_size!r}"
                )
        elif self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be positive when given, got {self.block_size!r}")

    @property
    def is_block_causal(self) -> bool:
        return self.attention == "block_causal"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiffusionConfig:
        return dataclass_from_dict(cls, data, "diffusion config")

    @classmethod
    def from_model_config(cls, config: Any) -> DiffusionConfig | None:
        """Read the description stored in a transformers config, or ``None`` if it has none."""
        data = getattr(config, CONFIG_KEY, None)
        if data is None:
            return None
        if isinstance(data, DiffusionConfig):
            return data
        return cls.from_dict(dict(data))

    def save_to_model_config(self, config: Any) -> None:
        """Store this description in a transformers config (it then travels with ``save_pretrained``)."""
        setattr(config, CONFIG_KEY, self.to_dict())


def block_offset(prompt_len: Any, block_length: int, block_causal: bool) -> Any:
    """Position of the first completion token inside its decoding block (ints or tensors).

    Bidirectional models start blocks at the end of the prompt (offset 0); block-causal models align blocks to
    absolute position 0, so the prompt's tail shares the first block. Training and decoding both read this rule:
    it is what keeps a student's blocks where its sampler will put them.
    """
    return prompt_len % block_length if block_causal else 0


def require_diffusion_config(model: Any) -> DiffusionConfig:
    """The diffusion description stored in ``model.config``; a ``ValueError`` saying how to attach one if absent.

    The one check shared by the sampler, trajectory collection and the trainer, so a plain transformers model
    gets the same message everywhere.
    """
    diffusion = DiffusionConfig.from_model_config(model.config)
    if diffusion is None:
        raise ValueError(
            f"{type(model).__name__} has no mask token (no diffusion description in its config): load it with "
            "AutoModelForDiffusionLM.from_pretrained, or call add_diffusion_generation(model, "
            "DiffusionConfig(mask_token_id=...)) first"
        )
    return diffusion
