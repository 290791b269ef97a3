"""Training data made ready for :class:`~t3d_trl.T3DTrainer`: checked against the student, tokenised, cut.

* Trajectories must come from a teacher with the student's tokenizer (vocabulary, mask token) and attention,
  and the training block length must be the teacher's (trajectory states exist only for the teacher's blocks).
* Every row is checked once, column-wise in Arrow: token ids inside the vocabulary, ``decode_step`` as long as
  the completion and 1-based, every block's steps after the previous block's (the block-by-block order in which
  the teacher decoded; a state in the middle of a block would otherwise mask later blocks too), a prompt for a
  shifted-logit student (Dream). A bad row is named (index and id) rather than failing inside a batch.
* Rows over the limits: prompts are never truncated (the row is dropped); completions are cut to
  ``max_completion_length``. A row longer than the model's positions after the cut is dropped too (its
  positions would have no embedding). Every dropped row is counted in one warning, under the first rule it breaks.
* ``mdlm`` trains on real data: ``prompt``/``completion`` or ``text`` columns are tokenised (EOS appended); a
  ``prompt`` the way collection and evaluation tokenise every prompt (:func:`~t3d_trl.data.prompts.encode_prompts`).
  A shifted-logit student predicts each token from the position before it, so a ``text`` row's first token is its
  prompt (as a causal LM never predicts its first token).
"""

from __future__ import annotations

import logging
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..diffusion.config import DiffusionConfig, block_offset
from .prompts import encode_prompts
from .schema import TrajectoryMetadata

logger = logging.getLogger(__name__)

#: The columns a prepared dataset keeps (the trainer's signature columns).
TRAINING_COLUMNS = ("prompt_ids", "completion_ids", "decode_step", "row_index")


def resolve_block_length(
    requested: int | None,
    metadata: TrajectoryMetadata | None,
    diffusion: DiffusionConfig,
    trajectory_states: bool,
) -> int:
    """The training block length: ``requested``, else the trajectories', else the model's, else 4.

    ``trajectory_states``: the objective trains on the teacher's states, which exist for its blocks only.
    """
    if metadata is not None and requested not in (None, metadata.block_length) and trajectory_states:
        raise ValueError(
            f"block_length={requested} differs from the trajectories' block_length="
            f"{metadata.block_length}: trajectory states exist only for the teacher's blocks"
        )
    if metadata is not None and metadata.attention != diffusion.attention:
        raise ValueError(
            f"the trajectories were decoded with {metadata.attention} attention but the student is "
            f"{diffusion.attention}: block alignment would not match"
        )
    block = requested or (metadata.block_length if metadata else None) or diffusion.block_size
    return int(block or 4)


def check_trajectory_metadata(
    metadata: TrajectoryMetadata | None, diffusion: DiffusionConfig, vocab_size: int
) -> None:
    """Refuse trajectories made with another tokenizer than the model's (vocabulary or mask token)."""
    if metadata is None:
        return
    if metadata.vocab_size is not None and metadata.vocab_size != vocab_size:
        raise ValueError(
            f"the trajectories come from a model with a vocabulary of {metadata.vocab_size} (teacher "
            f"{metadata.teacher!r}) but the model has {vocab_size}: they were made with another tokenizer"
        )
    if metadata.mask_token_id != diffusion.mask_token_id:
        raise ValueError(
            f"the trajectories use mask token id {metadata.mask_token_id} but the model uses "
            f"{diffusion.mask_token_id}: they were made with another tokenizer"
        )


def _refuse_rows(dataset: datasets.Dataset, bad: np.ndarray, where: str, problem: str) -> None:
    if bad.any():
        index = int(np.flatnonzero(bad)[0])
        row_id = dataset[index]["id"] if "id" in dataset.column_names else index
        raise ValueError(f"{where} row {index} (id={row_id!r}): {problem} ({int(bad.sum())} such rows)")


def _null_rows(column: Any) -> np.ndarray:
    """Rows whose value is null, or (a list column) holds a null item."""
    bad = column.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        items = pc.list_flatten(column)
        if items.null_count:
            parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
            bad[parents[items.is_null().to_numpy(zero_copy_only=False)]] = True
    return bad


def _arrow_columns(dataset: datasets.Dataset, columns: list[str]) -> Any:
    return dataset.select_columns(columns).with_format("arrow")[:]


def _refuse_null_rows(dataset: datasets.Dataset, table: Any, name: str) -> None:
    """Name the first row of ``dataset`` with a null value in a column of ``table`` (its Arrow columns): it would
    fail inside a batch (tokenizer, collator)."""
    for column in table.column_names:
        _refuse_rows(dataset, _null_rows(table[column]), f"{name} dataset", f"{column} is or holds None")


def tokenize_text(
    dataset: datasets.Dataset,
    tokenizer: Any,
    name: str,
    num_proc: int | None = None,
    shift_logits: bool = False,
) -> datasets.Dataset:
    """``prompt``/``completion`` or ``text`` columns as ``prompt_ids``/``completion_ids`` (EOS appended).

    A ``prompt`` is tokenised as collection and evaluation tokenise one (:func:`encode_prompts`): a chat rendering
    (it starts with BOS) as it is, a raw message with the tokenizer's special tokens (BOS), so the model trains on
    the ids it is evaluated with. A ``text`` row has no prompt, unless ``shift_logits`` (Dream: token ``i`` is
    predicted at position ``i - 1``): then its first token is the prompt, the position the second is predicted at.
    """
    columns = set(dataset.column_names)
    if tokenizer is None:
        raise ValueError(f"loss_type='mdlm' on text needs processing_class (a tokenizer) to tokenise {name}")
    eos = tokenizer.eos_token_id

    def with_eos(ids: list[int]) -> list[int]:
        return ids + [eos] if eos is not None and (not ids or ids[-1] != eos) else ids

    for column in ("prompt", "completion", "text"):
        feature = dataset.features.get(column)
        if feature is not None and getattr(feature, "dtype", None) not in ("string", "large_string"):
            raise ValueError(
                f"loss_type='mdlm' tokenises text, but the {name} dataset's {column!r} column holds {feature} "
                "(conversational message lists are not read): render them into prompt/completion strings with "
                "the chat template first (recipes/prepare_sft_data.py does)"
            )
    if {"prompt", "completion"} <= columns:
        _refuse_null_rows(dataset, _arrow_columns(dataset, ["prompt", "completion"]), name)

        def tokenize(batch: dict[str, list]) -> dict[str, list]:
            _, prompt_ids = encode_prompts(tokenizer, batch["prompt"], use_chat_template=False)
            completions = tokenizer(batch["completion"], add_special_tokens=False)["input_ids"]
            return {"prompt_ids": prompt_ids, "completion_ids": [with_eos(ids) for ids in completions]}

    elif "text" in columns:
        _refuse_null_rows(dataset, _arrow_columns(dataset, ["text"]), name)

        def tokenize(batch: dict[str, list]) -> dict[str, list]:
            texts = [with_eos(ids) for ids in tokenizer(batch["text"])["input_ids"]]
            first = 1 if shift_logits else 0
            return {
                "prompt_ids": [ids[:first] for ids in texts],
                "completion_ids": [ids[first:] for ids in texts],
            }

    else:
        raise ValueError(
            f"loss_type='mdlm' needs prompt_ids/completion_ids, prompt/completion or text columns; the {name} "
            f"dataset has {sorted(columns)}"
        )
    return dataset.map(tokenize, batched=True, num_proc=num_proc, desc=f"Tokenizing {name} dataset")


def _block_order_problems(table: Any, block_length: int, block_causal: bool) -> np.ndarray:
    """Rows whose ``decode_step`` does not decode block by block: some step of a block is not after every step of
    the block before it (blocks of ``block_length`` placed as the collator and the sampler place them)."""
    lengths = pc.list_value_length(table["completion_ids"]).to_numpy(zero_copy_only=False)
    steps = pc.list_flatten(table["decode_step"]).to_numpy(zero_copy_only=False)
    if not len(steps):
        return np.zeros(len(lengths), dtype=bool)
    row = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(len(steps)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    prompts = pc.list_value_length(table["prompt_ids"]).to_numpy(zero_copy_only=False)
    block = (block_offset(prompts[row], block_length, block_causal) + position) // block_length
    # Each (row, block) is a run of consecutive tokens: compare each run with the run before it in its row.
    starts = np.flatnonzero(np.r_[True, (row[1:] != row[:-1]) | (block[1:] != block[:-1])])
    first, last = np.minimum.reduceat(steps, starts), np.maximum.reduceat(steps, starts)
    late = (row[starts][1:] == row[starts][:-1]) & (last[:-1] >= first[1:])
    bad = np.zeros(len(lengths), dtype=bool)
    bad[row[starts][1:][late]] = True
    return bad


def _check_rows(
    dataset: datasets.Dataset,
    table: Any,
    name: str,
    needed: list[str],
    vocab_size: int,
    diffusion: DiffusionConfig,
    block_length: int,
) -> None:
    """Refuse rows with null values, a ``decode_step`` that does not fit the completion or its blocks, token ids
    outside the vocabulary, an empty prompt for a shifted-logit student."""
    _refuse_null_rows(dataset, table, name)
    if diffusion.shift_logits:
        _refuse_rows(
            dataset,
            pc.equal(pc.list_value_length(table["prompt_ids"]), 0).to_numpy(zero_copy_only=False),
            f"{name} dataset",
            "prompt_ids is empty: a shifted-logit student (Dream) predicts each token from the position before "
            "it, which the first completion token would not have; start the prompt with BOS",
        )
    if "decode_step" in needed:
        lengths = pc.list_value_length(table["completion_ids"])
        bad = pc.not_equal(lengths, pc.list_value_length(table["decode_step"]))
        _refuse_rows(
            dataset,
            bad.to_numpy(zero_copy_only=False),
            f"{name} dataset",
            "completion_ids and decode_step differ in length",
        )
        steps = pc.list_flatten(table["decode_step"])
        if len(steps) and pc.min(steps).as_py() < 1:
            raise ValueError(
                f"{name} dataset: decode_step holds values below 1 (steps are global and 1-based)"
            )
        _refuse_rows(
            dataset,
            _block_order_problems(table, block_length, diffusion.is_block_causal),
            f"{name} dataset",
            f"decode_step does not decode block by block in blocks of {block_length}: a block's steps must all "
            "come after the previous block's (steps are global, counted over the whole completion; a teacher "
            "that decoded with another block length needs block_length set to its)",
        )
    for column in ("prompt_ids", "completion_ids"):
        ids = pc.list_flatten(table[column])
        bad = pc.or_(pc.less(ids, 0), pc.greater_equal(ids, vocab_size))
        if len(ids) and pc.any(bad).as_py():
            first = pc.index(bad, True).as_py()
            row_ends = np.cumsum(pc.list_value_length(table[column]).to_numpy(zero_copy_only=False))
            index = int(np.searchsorted(row_ends, first, side="right"))
            row_id = dataset[index]["id"] if "id" in dataset.column_names else index
            raise ValueError(
                f"{name} dataset row {index} (id={row_id!r}): {column} holds token id {ids[first].as_py()}, "
                f"outside the model's vocabulary of {vocab_size}: the data was tokenised with another tokenizer"
            )


def _rows_to_drop(
    table: Any, max_prompt_length: int | None, max_completion_length: int | None, max_positions: int | None
) -> tuple[np.ndarray, list[str]]:
    """(rows to drop, ``"<count> <rule>"`` for each rule that drops any), each row under the first rule it breaks."""
    limit = max_completion_length
    prompt_lengths = pc.list_value_length(table["prompt_ids"]).to_numpy(zero_copy_only=False)
    completion_lengths = pc.list_value_length(table["completion_ids"]).to_numpy(zero_copy_only=False)
    if limit is not None:
        completion_lengths = np.minimum(completion_lengths, limit)
    rules = {"empty completion": completion_lengths == 0}
    if max_prompt_length is not None:
        rules[f"prompt longer than max_prompt_length={max_prompt_length}"] = (
            prompt_lengths > max_prompt_length
        )
    if max_positions is not None:
        rules[
            f"prompt + completion (cut to max_completion_length={limit}) longer than the model's "
            f"max_position_embeddings={max_positions}"
        ] = prompt_lengths + completion_lengths > max_positions
    drop = np.zeros(len(prompt_lengths), dtype=bool)
    counts = []
    for rule, hit in rules.items():
        if (hit & ~drop).any():
            counts.append(f"{int((hit & ~drop).sum())} {rule}")
        drop |= hit
    return drop, counts


def prepare_training_dataset(
    dataset: datasets.Dataset,
    name: str,
    *,
    loss_type: str,
    trajectory_states: bool,
    tokenizer: Any,
    vocab_size: int,
    diffusion: DiffusionConfig,
    block_length: int,
    max_positions: int | None,
    max_prompt_length: int | None,
    max_completion_length: int | None,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """``dataset`` checked and cut for training (columns :data:`TRAINING_COLUMNS`), kept in memory.

    Args:
        dataset: trajectories, or for ``loss_type="mdlm"`` token or text columns.
        name: how errors and warnings call it (``"train"``, ``"eval"``).
        loss_type: the objective (``"mdlm"`` tokenises text columns).
        trajectory_states: the objective reads ``decode_step`` (the teacher's decoding order).
        tokenizer: tokenises text for ``mdlm``.
        vocab_size, max_positions: the student's vocabulary and ``max_position_embeddings``.
        diffusion, block_length: the student's diffusion description and the training block length.
        max_prompt_length, max_completion_length, num_proc: as in :class:`~t3d_trl.T3DConfig`.
    """
    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(f"{name} dataset must be a datasets.Dataset, got {type(dataset).__name__}")
    columns = set(dataset.column_names)
    if loss_type == "mdlm" and not {"prompt_ids", "completion_ids"} <= columns:
        dataset = tokenize_text(dataset, tokenizer, name, num_proc, diffusion.shift_logits)
        columns = set(dataset.column_names)
    needed = ["prompt_ids", "completion_ids"] + (["decode_step"] if trajectory_states else [])
    missing = [c for c in needed if c not in columns]
    if missing:
        hint = (
            " (the teacher's decoding order: collect trajectories with t3d_trl.collect_trajectories)"
            if "decode_step" in missing
            else ""
        )
        raise ValueError(
            f"loss_type={loss_type!r} needs column(s) {missing}{hint}; the {name} dataset has {sorted(columns)}"
        )
    table = _arrow_columns(dataset, needed)
    _check_rows(dataset, table, name, needed, vocab_size, diffusion, block_length)
    drop, counts = _rows_to_drop(table, max_prompt_length, max_completion_length, max_positions)
    if drop.any():
        logger.warning(
            "%s dataset: dropped %d of %d rows (%s)", name, int(drop.sum()), len(drop), "; ".join(counts)
        )
        # In memory: no cache file is written into the folder the data was loaded from.
        dataset = dataset.select(np.flatnonzero(~drop), keep_in_memory=True)
    if len(dataset) == 0:
        raise ValueError(f"{name} dataset has no usable rows")
    dataset = dataset.remove_columns([c for c in dataset.column_names if c not in needed])
    limit = max_completion_length
    if limit is not None:  # documented, but said: a cut changes what the student learns from
        lengths = pc.list_value_length(table["completion_ids"]).to_numpy(zero_copy_only=False)[~drop]
        cut = int((lengths > limit).sum())
        if cut:
            logger.warning(
                "%s dataset: cut %d of %d completions to max_completion_length=%d tokens",
                name,
                cut,
                len(lengths),
                limit,
            )

    def finish(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        if limit is not None:
            for column in needed[1:]:
                batch[column] = [values[:limit] for values in batch[column]]
        batch["row_index"] = indices
        return batch

    return dataset.map(finish, batched=True, with_indices=True, num_proc=num_proc, keep_in_memory=True)
