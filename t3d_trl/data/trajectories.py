"""Collect teacher trajectories into a ``datasets.Dataset`` (schema: :mod:`t3d_trl.data.schema`).

How a collection runs:

* Every source row becomes a prompt (template or chat column, then the chat template), tokenised once.
  Prompts are sorted by length (longest first, so memory problems show at once) and cut into batches. The
  batches depend only on the data and the settings, never on how many processes run them.
* Each batch is decoded with ``model.diffusion_generate`` under a generator seeded from ``(seed, the batch's
  ids)``, so a batch gives the same rows whichever process runs it, and whether or not it is a rerun.
* Before anything is decoded, the teacher is checked: it must have a diffusion description, the tokenizer
  must fit its vocabulary, and the settings must fit it (positions, block length). Prompts too long for
  ``max_prompt_length`` or for the model's positions (prompt + ``max_new_tokens``) are dropped and counted.
* Each finished batch is written at once as one parquet shard (written to a temporary name, then renamed),
  so a crash or Ctrl-C loses at most the batch in flight. A rerun with the same ``output_dir`` skips the
  batches already written and valid; a shard that fails validation (unreadable, other ids, a row breaking
  the contract of :func:`~t3d_trl.data.schema.row_problem`) is decoded again, and a freshly decoded shard
  that fails stops the run with an error naming it. It refuses to resume when the settings differ from the
  ones the folder was started with, naming each difference.
* Several processes (``accelerate launch`` / ``torchrun``, one per GPU, or several CPU processes) take
  every ``world_size``-th batch; the main process then merges the shards in source order, applies the
  filters, and saves the dataset into ``output_dir`` (``save_to_disk`` layout), where
  :func:`t3d_trl.load_trajectories` reads it. No row is dropped without being counted: the counts of
  prompts, rows and rows dropped by each rule are stored in ``collection.json`` (:func:`collection_summary`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from ..diffusion.config import require_diffusion_config
from ..generation.configuration import DiffusionGenerationConfig
from ..generation.sampler import eos_token_ids, left_pad
from ..utils import MissingKeyError, check_process_count
from ..version import __version__
from .prompts import encode_prompts, format_user_message
from .schema import TRAJECTORY_COLUMNS, TrajectoryMetadata, row_problem

logger = logging.getLogger(__name__)

MANIFEST = "collection.json"
SHARD_DIR = "shards"
SUMMARY_KEY = "summary"  # the manifest entry holding the counts of the last merge (not a setting)


@dataclass
class PromptRow:
    """One source row ready for the teacher."""

    index: int  # position in the source dataset (the merged dataset keeps source order)
    id: str
    prompt: str
    prompt_ids: list[int]
    extra: dict[str, Any]  # pass-through columns


def _user_message(row: Mapping[str, Any], template: str, prompt_column: str) -> str:
    # The template's {problem} field reads `prompt_column`, other fields read the columns of their name.
    if prompt_column not in row:
        raise MissingKeyError(
            f"prompt_column {prompt_column!r} is not a column of the dataset; it has {sorted(row)}"
        )
    return format_user_message(template, {**row, "problem": row[prompt_column]})


def build_prompts(
    dataset: datasets.Dataset,
    tokenizer: Any,
    prompt_template: str = "math",
    *,
    prompt_column: str = "problem",
    id_column: str | None = None,
    chat_column: str | None = None,
    use_chat_template: bool = True,
    keep_columns: Sequence[str] | None = None,
) -> list[PromptRow]:
    """Render and tokenise the prompt of every source row (see :func:`collect_trajectories` for the arguments).

    The prompt text is tokenised without adding special tokens: the chat template already holds them, so
    ``prompt_ids`` is exactly the tokenisation of ``prompt``. Every row gives a prompt; length limits are
    applied by :func:`drop_long_prompts`.
    """
    columns = list(dataset.column_names)
    if id_column is None and "id" in columns:
        id_column = "id"
    for name, value in (("id_column", id_column), ("chat_column", chat_column)):
        if value is not None and value not in columns:
            raise ValueError(f"{name}={value!r} is not a column of the dataset; it has {columns}")
    if chat_column is not None and not use_chat_template:
        raise ValueError(f"chat_column={chat_column!r} needs use_chat_template=True")
    if keep_columns is None:
        keep = [c for c in columns if c not in TRAJECTORY_COLUMNS]
    else:
        keep = list(keep_columns)
        clash = [c for c in keep if c in TRAJECTORY_COLUMNS]
        absent = [c for c in keep if c not in columns]
        if clash or absent:
            raise ValueError(
                f"keep_columns {keep}: {clash or absent} "
                + ("are trajectory columns" if clash else f"are not columns of the dataset ({columns})")
            )
    prompts: list[PromptRow] = []
    seen: dict[str, int] = {}
    for index, row in enumerate(tqdm(dataset, desc="tokenising prompts", unit="prompt", leave=False)):
        if chat_column is not None:
            text = tokenizer.apply_chat_template(row[chat_column], tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # the template holds its specials
        else:
            message = _user_message(row, prompt_template, prompt_column)
            [text], [ids] = encode_prompts(tokenizer, [message], use_chat_template)
        row_id = str(row[id_column]) if id_column is not None else str(index)
        if row_id in seen:
            raise ValueError(
                f"id {row_id!r} appears twice (rows {seen[row_id]} and {index}); ids must be unique"
            )
        seen[row_id] = index
        prompts.append(PromptRow(index, row_id, text, list(ids), {c: row[c] for c in keep}))
    return prompts


def drop_long_prompts(
    prompts: Sequence[PromptRow],
    max_prompt_length: int | None,
    max_positions: int | None,
    max_new_tokens: int,
) -> tuple[list[PromptRow], dict[str, int]]:
    """Drop the prompts the teacher cannot decode; returns the kept prompts and ``{rule: rows dropped}``.

    A prompt is dropped when it plus ``max_new_tokens`` exceeds the model's ``max_position_embeddings`` (the
    sampler would refuse its whole batch), or when it is longer than ``max_prompt_length``; each dropped prompt
    is counted under the first of these rules it breaks. A prompt is never truncated: that would change the
    question.
    """
    rules = {
        f"prompt + max_new_tokens={max_new_tokens} beyond the model's max_position_embeddings={max_positions}": (
            None if max_positions is None else max_positions - max_new_tokens
        ),
        f"prompt longer than max_prompt_length={max_prompt_length}": max_prompt_length,
    }
    dropped = dict.fromkeys(rules, 0)
    kept = []
    for prompt in prompts:
        rule = next(
            (r for r, limit in rules.items() if limit is not None and len(prompt.prompt_ids) > limit), None
        )
        if rule is None:
            kept.append(prompt)
        else:
            dropped[rule] += 1
    dropped = {rule: n for rule, n in dropped.items() if n}
    for rule, n in dropped.items():
        logger.warning("dropped %d of %d prompts: %s", n, len(prompts), rule)
    return kept, dropped


def plan_batches(prompts: Sequence[PromptRow], batch_size: int) -> list[list[PromptRow]]:
    """Sort prompts by length (longest first, ties in source order) and cut them into batches."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    ordered = sorted(prompts, key=lambda p: (-len(p.prompt_ids), p.index))
    return [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]


def batch_seed(seed: int, ids: Sequence[str]) -> int:
    """A 63-bit seed derived from the collection seed and a batch's ids (independent of the process)."""
    digest = hashlib.sha256(json.dumps([seed, list(ids)]).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def cut_at_eos(
    tokens: Sequence[int], steps: Sequence[int], eos_ids: Sequence[int]
) -> tuple[list[int], list[int], bool]:
    """Cut a generated row after its first EOS (kept). Returns ``(tokens, steps, finished)``."""
    eos = set(eos_ids)
    for i, token in enumerate(tokens):
        if token in eos:
            return list(tokens[: i + 1]), list(steps[: i + 1]), True
    return list(tokens), list(steps), False


def _generate_batch(
    model: Any,
    tokenizer: Any,
    batch: Sequence[PromptRow],
    config: DiffusionGenerationConfig,
    seed: int,
    pad_id: int,
) -> list[dict[str, Any]]:
    device = next(model.parameters()).device
    input_ids, attention_mask = left_pad([p.prompt_ids for p in batch], pad_id)
    generator = torch.Generator(device=device).manual_seed(batch_seed(seed, [p.id for p in batch]))
    out = model.diffusion_generate(
        input_ids.to(device), attention_mask.to(device), generation_config=config, generator=generator
    )
    width = input_ids.shape[1]
    generated = out.sequences[:, width:].tolist()
    steps = out.decode_steps.tolist()
    rows = []
    for p, tokens, token_steps in zip(batch, generated, steps):
        completion_ids, decode_step, finished = cut_at_eos(tokens, token_steps, config.eos_token_id)
        rows.append(
            {
                "id": p.id,
                "prompt": p.prompt,
                "prompt_ids": p.prompt_ids,
                "completion_ids": completion_ids,
                "decode_step": decode_step,
                "finished": finished,
                "completion": tokenizer.decode(completion_ids, skip_special_tokens=True),
                **p.extra,
            }
        )
    return rows


def _features(dataset: datasets.Dataset, keep: Sequence[str]) -> datasets.Features:
    ids = datasets.List(datasets.Value("int32"))
    base = {
        "id": datasets.Value("string"),
        "prompt": datasets.Value("string"),
        "prompt_ids": ids,
        "completion_ids": ids,
        "decode_step": ids,
        "finished": datasets.Value("bool"),
        "completion": datasets.Value("string"),
    }
    return datasets.Features({**base, **{c: dataset.features[c] for c in keep}})


def _write_shard(path: Path, rows: list[dict[str, Any]], features: datasets.Features) -> None:
    table = pa.Table.from_pylist([features.encode_example(r) for r in rows], schema=features.arrow_schema)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)  # atomic: a shard is either complete or absent


def _shard_path(output_dir: Path, batch_index: int) -> Path:
    return output_dir / SHARD_DIR / f"batch-{batch_index:06d}.parquet"


def _rows_problem(
    rows: Sequence[Mapping[str, Any]], batch: Sequence[PromptRow], metadata: TrajectoryMetadata
) -> str | None:
    """What is wrong with one batch's rows (other ids or prompts than the batch's, a row breaking the contract)."""
    expected = {p.id: p for p in batch}
    ids = [row["id"] for row in rows]
    if sorted(ids) != sorted(expected):
        foreign = sorted(set(ids) - set(expected))
        if foreign:
            return f"it holds id(s) {foreign[:3]} that are not in its batch"
        missing = sorted(set(expected) - set(ids))
        return f"it lacks id(s) {missing[:3]} of its batch" if missing else "it holds an id twice"
    for row in rows:
        if row["prompt_ids"] != expected[row["id"]].prompt_ids:
            return f"row id={row['id']!r}: its prompt_ids are not the prompt's (another collection's shard?)"
        problem = row_problem(row, metadata)
        if problem is not None:
            return f"row id={row['id']!r}: {problem}"
    return None


def _shard_problem(
    path: Path, batch: Sequence[PromptRow], features: datasets.Features, metadata: TrajectoryMetadata
) -> str | None:
    """What is wrong with a written shard, or ``None`` when it holds exactly its batch's valid rows."""
    try:
        missing = [name for name in features if name not in pq.read_schema(path).names]
        if missing:  # read with the schema, they would come back as nulls
            return f"it lacks column(s) {missing}"
        table = pq.read_table(path, schema=features.arrow_schema)
    except (pa.ArrowException, OSError, ValueError, KeyError) as err:  # truncated, other columns or types
        return f"it cannot be read with the collection's columns ({type(err).__name__}: {err})"
    return _rows_problem(table.to_pylist(), batch, metadata)


def _differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        out: list[str] = []
        for key in sorted(set(saved) | set(current)):
            out += _differences(saved.get(key), current.get(key), f"{prefix}{key}.")
        return out
    return [] if saved == current else [f"{prefix[:-1]}: {saved!r} (saved) != {current!r} (now)"]


def _check_manifest(output_dir: Path, manifest: dict[str, Any], is_main: bool, barrier: Any) -> None:
    path = output_dir / MANIFEST
    if is_main:
        output_dir.joinpath(SHARD_DIR).mkdir(parents=True, exist_ok=True)
        for stale in output_dir.joinpath(SHARD_DIR).glob(".*.tmp"):  # a shard interrupted while written
            stale.unlink()
        if not path.exists():
            path.write_text(json.dumps(manifest, indent=2))
    barrier()
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path} is not valid JSON ({err}): delete {output_dir} to start the collection over"
        ) from err
    # A newer package version may resume an older collection; everything else must match.
    saved.pop(SUMMARY_KEY, None)  # the counts of an earlier merge are not a setting
    saved["metadata"].pop("t3d_trl_version", None)
    current = json.loads(json.dumps(manifest))
    current["metadata"].pop("t3d_trl_version", None)
    diffs = _differences(saved, current)
    if diffs:
        raise ValueError(
            f"{output_dir} holds a collection started with other settings; refusing to resume. Differences:\n  "
            + "\n  ".join(diffs)
            + "\nUse another output_dir, or delete this one to start over."
        )


def _process_group() -> tuple[int, int, Any]:
    """``(rank, world_size, barrier)`` from torch.distributed, joining the launcher's group if needed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Under `accelerate launch` / `torchrun`: join the launcher's group (env:// rendezvous). Done here
        # rather than through accelerate's PartialState, a process-wide singleton that may already hold a
        # one-process state (a forked worker inherits it).
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), dist.barrier
    return 0, 1, lambda: None


def _resolve_model(
    model: Any, tokenizer: Any, revision: str | None, model_kwargs: Mapping[str, Any]
) -> tuple[Any, Any]:
    """Load a teacher given by name (onto this process's GPU, if any) and its tokenizer."""
    from transformers import AutoTokenizer

    if isinstance(model, str):
        from ..models.auto import AutoModelForDiffusionLM

        name = model
        model = AutoModelForDiffusionLM.from_pretrained(name, revision=revision, **model_kwargs)
        if torch.cuda.is_available() and "device_map" not in model_kwargs:
            model.to(torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))))
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(name, revision=revision)
    if tokenizer is None:
        tokenizer = getattr(model, "name_or_path", None)
        if not tokenizer:
            raise ValueError("pass a tokenizer: the model has no name or path to load one from")
    if isinstance(tokenizer, str):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    return model.eval(), tokenizer


def _check_teacher(model: Any, tokenizer: Any) -> int:
    """Refuse a teacher that cannot decode with this tokenizer, before any work; returns its vocabulary size."""
    diffusion = require_diffusion_config(model)
    if not hasattr(model, "diffusion_generate"):
        raise ValueError(
            f"{type(model).__name__} has a diffusion description but no diffusion_generate: load it with "
            "AutoModelForDiffusionLM.from_pretrained, or call add_diffusion_generation(model) first"
        )
    head = model.get_output_embeddings()
    # The number of logits bounds every id the teacher can emit (the tokenizer may count fewer).
    vocab = (head if head is not None else model.get_input_embeddings()).weight.shape[0]
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if len(tokenizer) > vocab:
        raise ValueError(
            f"the tokenizer {name!r} has {len(tokenizer)} tokens but the model "
            f"{getattr(model, 'name_or_path', '') or type(model).__name__!r} has a vocabulary of {vocab}: pass "
            "the teacher's own tokenizer"
        )
    if diffusion.mask_token_id >= vocab:
        raise ValueError(
            f"mask_token_id={diffusion.mask_token_id} is outside the model's vocabulary of {vocab}"
        )
    return vocab


def _teacher_settings(
    model: Any,
    tokenizer: Any,
    config: DiffusionGenerationConfig,
    *,
    vocab: int,
    seed: int,
    prompt_template: str,
    use_chat_template: bool,
    teacher_revision: str | None,
) -> tuple[DiffusionGenerationConfig, TrajectoryMetadata]:
    """The decoding settings with every default the sampler would look up made explicit, and the metadata."""
    diffusion = require_diffusion_config(model)
    block_length, steps_per_block = config.resolve(
        diffusion.block_size if diffusion.is_block_causal else None
    )
    eos_ids = eos_token_ids(model, config) or (
        [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    )
    outside = [e for e in eos_ids if not 0 <= e < vocab]
    if outside:
        raise ValueError(f"eos_token_id {outside} is outside the model's vocabulary of {vocab}")
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and config.max_new_tokens >= max_positions:
        raise ValueError(
            f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt in the model's "
            f"max_position_embeddings={max_positions}"
        )
    if not eos_ids:
        logger.warning("no EOS token known: every completion will run to max_new_tokens")
    config = config.update(
        block_length=block_length, eos_token_id=eos_ids, return_dict_in_generate=True, output_history=False
    )
    if config.approximate_cache is not None:
        logger.warning(
            f"cache_implementation={config.approximate_cache!r} is approximate: later steps of a block see keys/values computed at its first "
            "step, so the trajectories are not the teacher's exact decoding (the metadata records it)"
        )
    chat = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template and not chat:
        logger.warning("the tokenizer has no chat template: prompts are the raw user messages")
    metadata = TrajectoryMetadata(
        teacher=getattr(model, "name_or_path", "") or "unknown",
        teacher_revision=teacher_revision or getattr(model.config, "_commit_hash", None),
        mask_token_id=diffusion.mask_token_id,
        attention=diffusion.attention,
        block_length=block_length,
        steps_per_block=steps_per_block,
        max_new_tokens=config.max_new_tokens,
        remasking=config.remasking,
        temperature=config.temperature,
        seed=seed,
        prompt_template=prompt_template,
        use_chat_template=chat,
        vocab_size=vocab,
        eos_token_ids=eos_ids,
        t3d_trl_version=__version__,
        threshold=config.threshold,
        schedule=config.schedule,
        cache=config.approximate_cache or "none",
    )
    return config, metadata


def collect_trajectories(
    model: Any,
    tokenizer: Any,
    dataset: datasets.Dataset | Sequence[Mapping[str, Any]],
    prompt_template: str = "math",
    *,
    output_dir: str | os.PathLike,
    generation_config: DiffusionGenerationConfig | None = None,
    batch_size: int = 8,
    prompt_column: str = "problem",
    id_column: str | None = None,
    chat_column: str | None = None,
    use_chat_template: bool = True,
    keep_columns: Sequence[str] | None = None,
    max_prompt_length: int | None = None,
    filter_unfinished: bool = False,
    gold_column: str | None = None,
    answer_checker: Callable[[str, str], bool] | None = None,
    seed: int = 0,
    teacher_revision: str | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
) -> datasets.Dataset:
    """Decode every prompt of ``dataset`` with the teacher and record its trajectories.

    Args:
        model: a model with ``diffusion_generate`` (see :func:`t3d_trl.add_diffusion_generation`), or a name
            or path loaded with :meth:`t3d_trl.AutoModelForDiffusionLM.from_pretrained`.
        tokenizer: the teacher's tokenizer, a name to load, or ``None`` to load the model's.
        dataset: the source ``datasets.Dataset`` (or a list of dicts).
        prompt_template: ``math`` or ``code`` (the paper's prompts), ``plain``, or a ``str.format`` pattern
            over the columns; its ``{problem}`` field reads ``prompt_column``.
        output_dir: where shards are written as the collection goes and the final dataset is saved
            (``save_to_disk`` layout). Rerunning with the same folder resumes.
        generation_config: teacher decoding settings; ``None``: the defaults saved with the model. The paper
            uses ``DiffusionGenerationConfig(block_length=4, tokens_per_step=1)`` (4 steps per block).
        batch_size: prompts decoded together.
        prompt_column: the column that fills the template's ``{problem}``.
        id_column: a column of unique row ids; default: ``id`` when the dataset has one, else the row index.
        chat_column: a column of chat messages (``[{"role": ..., "content": ...}]``) used instead of the
            template, wrapped by the tokenizer's chat template.
        use_chat_template: wrap the user message with the tokenizer's chat template (when it has one).
        keep_columns: source columns copied into each row; default: all but the trajectory columns.
        max_prompt_length: drop prompts longer than this many tokens (counted; prompts too long for the
            model's ``max_position_embeddings`` together with ``max_new_tokens`` are dropped and counted too).
        filter_unfinished: drop completions that hit ``max_new_tokens`` without EOS.
        gold_column: keep only completions that ``answer_checker`` accepts against this column; the column
            is passed through.
        answer_checker: ``checker(completion, gold) -> bool``, the correctness filter ``gold_column`` needs,
            e.g. :func:`t3d_trl.evaluation.math_checker.check_math` (what ``t3d-trl collect --gold_column``
            passes). Passed in, not imported here: ``data`` sits beneath ``evaluation``.
        seed: seeds every batch's generator together with the batch's ids.
        teacher_revision: Hub revision of the teacher (also used to load it by name).
        model_kwargs: ``from_pretrained`` keyword arguments when ``model`` is a name (``dtype``, ...).

    Returns:
        The trajectory dataset, in source order, with its :class:`TrajectoryMetadata` attached (every
        process gets it). :func:`collection_summary` tells how many prompts it came from and how many rows
        each rule dropped.
    """
    model, tokenizer = _resolve_model(model, tokenizer, teacher_revision, model_kwargs or {})
    vocab = _check_teacher(model, tokenizer)
    if isinstance(dataset, datasets.DatasetDict):
        raise TypeError(f"pass one split of the DatasetDict (it has {list(dataset)}), e.g. dataset['train']")
    if not isinstance(dataset, datasets.Dataset):
        dataset = datasets.Dataset.from_list(list(dataset))
    if gold_column is not None:
        if answer_checker is None:
            raise ValueError(
                "gold_column needs answer_checker, the function that judges a completion against it, e.g. "
                "answer_checker=t3d_trl.evaluation.math_checker.check_math"
            )
        if gold_column not in dataset.column_names:
            raise ValueError(
                f"gold_column={gold_column!r} is not a column of the dataset ({dataset.column_names})"
            )
        if keep_columns is not None and gold_column not in keep_columns:
            keep_columns = [*keep_columns, gold_column]
    if len(dataset) == 0:
        raise ValueError("no prompts to collect: the dataset is empty")
    # Settings are checked against the model before the (possibly long) tokenisation and any decoding.
    config, metadata = _teacher_settings(
        model,
        tokenizer,
        generation_config or model.diffusion_generation_config,
        vocab=vocab,
        seed=seed,
        prompt_template=f"chat:{chat_column}" if chat_column else prompt_template,
        use_chat_template=use_chat_template,
        teacher_revision=teacher_revision,
    )
    prompts = build_prompts(
        dataset,
        tokenizer,
        prompt_template,
        prompt_column=prompt_column,
        id_column=id_column,
        chat_column=chat_column,
        use_chat_template=use_chat_template,
        keep_columns=keep_columns,
    )
    prompts, dropped = drop_long_prompts(
        prompts,
        max_prompt_length,
        getattr(model.config, "max_position_embeddings", None),
        config.max_new_tokens,
    )
    if not prompts:
        raise ValueError(f"no prompts to collect: all {len(dataset)} were dropped ({', '.join(dropped)})")
    keep = list(prompts[0].extra)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (config.eos_token_id or [0])[0]

    batches = plan_batches(prompts, batch_size)
    digest = hashlib.sha256(json.dumps([[p.id, p.prompt] for p in prompts]).encode()).hexdigest()
    manifest = {
        "metadata": metadata.to_dict(),
        "generation_config": config.to_dict(),
        "collection": {
            "batch_size": batch_size,
            "prompt_column": prompt_column,
            "id_column": id_column,
            "chat_column": chat_column,
            "keep_columns": keep,
            "max_prompt_length": max_prompt_length,
            "num_prompts": len(prompts),
            "prompts_sha256": digest,
        },
    }
    output_dir = Path(output_dir)
    rank, world_size, barrier = _process_group()
    check_process_count(world_size, "collection", "each process would decode every prompt")
    _check_manifest(output_dir, manifest, rank == 0, barrier)
    features = _features(dataset, keep)

    mine = [(i, b) for i, b in enumerate(batches) if i % world_size == rank]
    todo = []
    for index, batch in mine:
        path = _shard_path(output_dir, index)
        if path.exists():
            problem = _shard_problem(path, batch, features, metadata)
            if problem is None:
                continue
            logger.warning("shard %s fails validation (%s): decoding its batch again", path, problem)
            path.unlink()
        todo.append((index, batch))
    done_prompts = sum(len(b) for _, b in mine) - sum(len(b) for _, b in todo)
    if done_prompts:
        logger.info(
            "resuming: %d of %d batches of this process already written", len(mine) - len(todo), len(mine)
        )
    bar = tqdm(
        total=sum(len(b) for _, b in mine),
        initial=done_prompts,
        unit="prompt",
        desc="collecting trajectories" + (f" (process {rank}/{world_size})" if world_size > 1 else ""),
        disable=rank != 0,
    )
    start, new_tokens = time.perf_counter(), 0
    try:
        for index, batch in todo:
            rows = _generate_batch(model, tokenizer, batch, config, seed, pad_id)
            problem = _rows_problem(rows, batch, metadata)
            if problem is not None:  # the teacher's own rows are valid unless the sampler has a defect
                raise RuntimeError(
                    f"shard {_shard_path(output_dir, index)} (batch {index}) fails validation right after "
                    f"decoding, so it was not written: {problem}"
                )
            _write_shard(_shard_path(output_dir, index), rows, features)
            new_tokens += sum(len(r["completion_ids"]) for r in rows)
            bar.update(len(batch))
            elapsed = time.perf_counter() - start
            bar.set_postfix(tokens_per_s=f"{new_tokens / elapsed:.1f}")
    except KeyboardInterrupt:
        written = sum(_shard_path(output_dir, i).exists() for i in range(len(batches)))
        logger.warning(
            "interrupted: %d of %d batches are saved in %s; the same call with the same output_dir resumes",
            written,
            len(batches),
            output_dir / SHARD_DIR,
        )
        raise
    finally:
        bar.close()

    barrier()
    if rank == 0:
        merged, filtered = merge_shards(
            output_dir,
            batches,
            features,
            metadata,
            filter_unfinished=filter_unfinished,
            gold_column=gold_column,
            answer_checker=answer_checker,
        )
        _save(merged, output_dir)
        summary = {"prompts": len(dataset), "rows": len(merged), "dropped": {**dropped, **filtered}}
        _write_summary(output_dir, summary)
        logger.info(collection_summary(output_dir))
    barrier()
    return datasets.load_from_disk(str(output_dir))


def merge_shards(
    output_dir: Path,
    batches: Sequence[Sequence[PromptRow]],
    features: datasets.Features,
    metadata: TrajectoryMetadata,
    *,
    filter_unfinished: bool = False,
    gold_column: str | None = None,
    answer_checker: Callable[[str, str], bool] | None = None,
) -> tuple[datasets.Dataset, dict[str, int]]:
    """Read every batch's (validated) shard, restore source order and apply the filters.

    ``gold_column`` keeps the rows whose completion ``answer_checker(completion, gold)`` accepts.

    Returns the dataset and ``{rule: rows dropped}`` for the filters that dropped rows.
    """
    missing = [i for i in range(len(batches)) if not _shard_path(output_dir, i).exists()]
    if missing:
        raise RuntimeError(
            f"{len(missing)} batches have no shard in {output_dir / SHARD_DIR} (first: {missing[0]})"
        )
    table = pa.concat_tables(
        [pq.read_table(_shard_path(output_dir, i), schema=features.arrow_schema) for i in range(len(batches))]
    )
    position = {p.id: p.index for batch in batches for p in batch}
    ids = table.column("id").to_pylist()
    foreign = sorted(set(ids) - position.keys())
    if foreign:
        raise ValueError(
            f"the shards in {output_dir / SHARD_DIR} hold ids that are not prompts of this collection "
            f"({foreign[:5]}): they come from another collection; delete {output_dir} to start over"
        )
    order = sorted(range(table.num_rows), key=lambda r: position[ids[r]])
    dataset = datasets.Dataset(table.take(pa.array(order)), info=datasets.DatasetInfo(features=features))
    metadata.attach(dataset)
    dropped: dict[str, int] = {}
    if filter_unfinished:
        before = len(dataset)
        dataset = dataset.filter(
            lambda finished: finished, input_columns="finished", desc="dropping unfinished"
        )
        dropped[f"unfinished (no EOS in max_new_tokens={metadata.max_new_tokens}; filter_unfinished)"] = (
            before - len(dataset)
        )
    if gold_column is not None:
        if answer_checker is None:
            raise ValueError("gold_column needs answer_checker")
        keep = [
            i
            for i, (completion, gold) in enumerate(zip(dataset["completion"], dataset[gold_column]))
            if gold is not None and answer_checker(completion, str(gold))
        ]
        dropped[f"answer does not match gold_column={gold_column!r}"] = len(dataset) - len(keep)
        dataset = dataset.select(keep)
    return dataset, {rule: n for rule, n in dropped.items() if n}


def _write_summary(output_dir: Path, summary: dict[str, Any]) -> None:
    path = output_dir / MANIFEST
    manifest = json.loads(path.read_text())
    manifest[SUMMARY_KEY] = summary
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, path)


def collection_summary(output_dir: str | os.PathLike) -> str:
    """One line on a finished collection: prompts, rows saved, and rows dropped by each rule.

    Read from the ``summary`` entry of ``output_dir/collection.json``, written when the shards are merged.
    """
    path = Path(output_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: {output_dir} is not a collection folder")
    summary = json.loads(path.read_text()).get(SUMMARY_KEY)
    if summary is None:
        raise ValueError(f"{output_dir} holds an unfinished collection: rerun it to finish and merge it")
    dropped = summary["dropped"]
    detail = "; ".join(f"{n} {rule}" for rule, n in dropped.items())
    return f"{summary['prompts']} prompts, {summary['rows']} trajectories saved to {output_dir}, " + (
        f"{sum(dropped.values())} dropped: {detail}" if dropped else "none dropped"
    )


def _save(dataset: datasets.Dataset, output_dir: Path) -> None:
    # Save beside, then move into place: a dataset memory-mapped from an earlier save keeps its old files.
    staging = output_dir / ".saving"
    shutil.rmtree(staging, ignore_errors=True)
    dataset.save_to_disk(str(staging))
    for item in staging.iterdir():
        os.replace(item, output_dir / item.name)
    staging.rmdir()
