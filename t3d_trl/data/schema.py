"""The trajectory dataset contract between collection (``collect_trajectories``) and training.

One row per teacher completion. Token ids and the teacher's decoding order live in the same row, so no
filtering or shuffling can misalign them (the defect of the public reference code, which stored text and
re-tokenised).

Columns:
    id (str): stable identifier of the source row.
    prompt (str): the exact prompt text the teacher saw (after the chat template).
    prompt_ids (list[int]): its token ids (no padding).
    completion_ids (list[int]): the teacher's completion, up to and including its first EOS when it finished.
    decode_step (list[int]): one entry per completion token: the global 1-based step at which the teacher
        unmasked it (``DiffusionGenerationOutput.decode_steps``).
    finished (bool): the completion ended with EOS (False: it hit ``max_new_tokens``).
    completion (str): the decoded completion text.
    plus pass-through columns of the source dataset (question, gold answer, ...).

Dataset-level metadata (:class:`TrajectoryMetadata`) says how the trajectories were produced; training and
evaluation read it back. It rides on the ``datasets.Dataset`` itself (``dataset.info.description``), so it
survives ``map``/``filter``/``select`` and ``save_to_disk``; on the Hub it lives in the dataset card.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..diffusion.config import block_offset
from ..utils import dataclass_from_dict

logger = logging.getLogger(__name__)

TRAJECTORY_COLUMNS = ("id", "prompt", "prompt_ids", "completion_ids", "decode_step", "finished", "completion")
# Key of the JSON object stored in ``dataset.info.description`` and of the dataset card's YAML entry.
METADATA_KEY = "trajectory_metadata"


@dataclass
class TrajectoryMetadata:
    """How a trajectory dataset was produced.

    Attributes:
        teacher: model name or path of the teacher.
        teacher_revision: Hub revision (commit) of the teacher, when known.
        mask_token_id: the teacher's mask token id.
        attention: ``bidirectional`` or ``block_causal`` (decides how blocks align with the prompt).
        block_length: decoding block length.
        steps_per_block: teacher denoising steps per block (static decoding).
        max_new_tokens: generation length limit.
        remasking: remasking rule of the teacher's decoding.
        temperature: sampling temperature of the teacher.
        seed: random seed of the collection.
        prompt_template: the template (name or pattern) that built the user messages, or ``chat:<column>``
            when the prompts came from a column of chat messages.
        use_chat_template: whether the tokenizer's chat template wrapped them.
        vocab_size: size of the teacher's output vocabulary (its number of logits, which bounds every token
            id it can produce; the tokenizer may count fewer); trainers refuse a model with another one.
        eos_token_ids: ids that end a completion.
        t3d_trl_version: package version that collected the data.
        threshold: confidence threshold of dynamic decoding; ``None`` for static decoding. With dynamic
            decoding ``decode_step`` counts each row's own steps, so only its order across blocks is checked.
        schedule: how static decoding split each block's masks over its steps (``llada``, ``sdar``, ``dream``;
            see :class:`~t3d_trl.DiffusionGenerationConfig`).
        cache: ``none`` when every step saw the exact canvas (the block-causal cache is exact); ``prefix`` or
            ``dual`` when the teacher decoded with Fast-dLLM's approximate cache, so later steps of a block
            saw keys/values computed at the block's first step (see :attr:`approximate`).
    """

    teacher: str
    mask_token_id: int
    attention: str
    block_length: int
    steps_per_block: int
    max_new_tokens: int
    remasking: str = "low_confidence"
    temperature: float = 0.0
    seed: int = 0
    prompt_template: str = "plain"
    use_chat_template: bool = True
    vocab_size: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    teacher_revision: str | None = None
    t3d_trl_version: str = ""
    threshold: float | None = None
    schedule: str = "llada"
    cache: str = "none"

    def __post_init__(self) -> None:
        if self.attention not in ("bidirectional", "block_causal"):
            raise ValueError(f"attention must be 'bidirectional' or 'block_causal', got {self.attention!r}")
        for name in ("block_length", "steps_per_block", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def approximate(self) -> bool:
        """Whether the teacher decoded with an approximate key/value cache (not its exact distribution)."""
        return self.cache != "none"

    @property
    def dynamic(self) -> bool:
        """Whether the teacher decoded dynamically (a confidence threshold instead of a fixed step budget)."""
        return self.threshold is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrajectoryMetadata:
        return dataclass_from_dict(cls, data, "trajectory metadata")

    @classmethod
    def from_dataset(cls, dataset: Any) -> TrajectoryMetadata | None:
        """The metadata attached to a ``datasets.Dataset`` by :meth:`attach`, or ``None``."""
        try:
            data = json.loads(dataset.info.description or "")
        except (json.JSONDecodeError, TypeError):
            return None
        if not isinstance(data, dict) or METADATA_KEY not in data:
            return None
        return cls.from_dict(data[METADATA_KEY])

    def attach(self, dataset: Any) -> Any:
        """Store this metadata in ``dataset.info`` (kept by ``map``, ``filter``, ``save_to_disk``); returns it."""
        dataset.info.description = json.dumps({METADATA_KEY: self.to_dict()})
        return dataset

    def block_offset(self, prompt_len: int) -> int:
        """Position of the first completion token inside its decoding block (see :func:`block_offset`)."""
        return block_offset(prompt_len, self.block_length, self.attention == "block_causal")

    def completion_blocks(self, prompt_len: int, completion_len: int) -> list[int]:
        """Decoding block (0-based, counted from the first block holding a completion token) of each token."""
        offset = self.block_offset(prompt_len)
        return [(offset + i) // self.block_length for i in range(completion_len)]


def row_problem(row: Mapping[str, Any], metadata: TrajectoryMetadata) -> str | None:
    """What is wrong with one trajectory row, or ``None`` when it honours the contract.

    Checks: no empty values; ``completion_ids`` and ``decode_step`` of equal, non-zero length at most
    ``max_new_tokens``; token ids inside the vocabulary and no mask token in the completion; ``finished``
    agrees with the EOS tokens; every step lies in its block's range (static decoding: a token of block ``k``
    has a step in ``[k * steps_per_block + 1, (k + 1) * steps_per_block]``; dynamic decoding: steps are
    positive and every block's steps come after the previous block's).
    """
    for name in TRAJECTORY_COLUMNS:
        if row.get(name) is None:
            return f"column {name!r} is empty (None)"
    prompt_ids = np.asarray(row["prompt_ids"], dtype=np.int64)
    tokens = np.asarray(row["completion_ids"], dtype=np.int64)
    steps = np.asarray(row["decode_step"], dtype=np.int64)
    if len(tokens) != len(steps):
        return f"completion_ids has {len(tokens)} tokens but decode_step has {len(steps)} entries"
    if len(tokens) == 0:
        return "the completion is empty"
    if len(tokens) > metadata.max_new_tokens:
        return f"the completion has {len(tokens)} tokens, more than max_new_tokens={metadata.max_new_tokens}"
    for name, ids in (("prompt_ids", prompt_ids), ("completion_ids", tokens)):
        bad = (ids < 0) | (ids >= metadata.vocab_size) if metadata.vocab_size else ids < 0
        if bad.any():
            return f"{name} holds token id {int(ids[bad][0])}, outside the vocabulary of size {metadata.vocab_size}"
    masked = np.flatnonzero(tokens == metadata.mask_token_id)
    if len(masked):
        return (
            f"completion_ids holds the mask token (id {metadata.mask_token_id}) at position {int(masked[0])}"
        )
    if metadata.eos_token_ids:
        is_eos = np.isin(tokens, metadata.eos_token_ids)
        if is_eos[:-1].any():
            return f"EOS at position {int(np.flatnonzero(is_eos)[0])} before the end of the completion"
        if bool(row["finished"]) != bool(is_eos[-1]):
            state = "ends" if is_eos[-1] else "does not end"
            return f"finished={bool(row['finished'])} but the completion {state} with EOS"
    if not row["finished"] and len(tokens) != metadata.max_new_tokens:
        return (
            f"finished=False (length limit) but the completion has {len(tokens)} tokens, not "
            f"max_new_tokens={metadata.max_new_tokens}"
        )
    blocks = np.asarray(metadata.completion_blocks(len(prompt_ids), len(tokens)))
    spb = metadata.steps_per_block
    if metadata.dynamic:
        high = (blocks + 1) * metadata.block_length  # every dynamic step commits at least one token
        bad = np.flatnonzero((steps < 1) | (steps > high))
        if len(bad):
            i = int(bad[0])
            return f"decode_step[{i}]={int(steps[i])} is outside [1, {int(high[i])}] (dynamic decoding)"
        for k in range(1, int(blocks[-1]) + 1):
            before, here = steps[blocks == k - 1], steps[blocks == k]
            if len(before) and len(here) and before.max() >= here.min():
                return f"decode_step of block {k} does not come after block {k - 1} (dynamic decoding)"
        return None
    low, high = blocks * spb + 1, (blocks + 1) * spb
    bad = np.flatnonzero((steps < low) | (steps > high))
    if len(bad):
        i = int(bad[0])
        return (
            f"decode_step[{i}]={int(steps[i])} is outside [{int(low[i])}, {int(high[i])}], the steps of block "
            f"{int(blocks[i])} (block_length={metadata.block_length}, steps_per_block={spb})"
        )
    return None


def validate_trajectories(dataset: Any, metadata: TrajectoryMetadata, skip_invalid: bool = False) -> Any:
    """Check every row of a trajectory ``datasets.Dataset`` with :func:`row_problem`.

    Raises ``ValueError`` naming the missing columns, or the first bad row's id and what is wrong with it. With
    ``skip_invalid=True`` bad rows are dropped instead, and their number is logged.
    """
    missing = [name for name in TRAJECTORY_COLUMNS if name not in dataset.column_names]
    if missing:
        raise ValueError(
            f"trajectory dataset lacks column(s) {missing}; expected {list(TRAJECTORY_COLUMNS)}, got "
            f"{dataset.column_names}"
        )
    keep: list[int] = []
    first_problem = None
    view = dataset.select_columns(list(TRAJECTORY_COLUMNS))
    for index, row in enumerate(view):
        problem = row_problem(row, metadata)
        if problem is None:
            keep.append(index)
            continue
        message = f"invalid trajectory row id={row['id']!r} (row {index}): {problem}"
        if not skip_invalid:
            raise ValueError(f"{message}. Pass skip_invalid=True to drop invalid rows.")
        first_problem = first_problem or message
    if len(keep) == len(dataset):
        return dataset
    logger.warning(
        "skipped %d invalid trajectory rows of %d; first: %s",
        len(dataset) - len(keep),
        len(dataset),
        first_problem,
    )
    return dataset.select(keep)
