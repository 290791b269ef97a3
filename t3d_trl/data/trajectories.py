"""Collect teacher trajectories into a ``datasets.Dataset`` (schema: :mod:`t3d_trl.data.schema`).

How a collection runs:

* Every source row becomes a prompt (template or chat column, then the chat template), tokenised once.
  Prompts are sorted by length (longest first, so memory problems show at once) and cut into batches. The
  batches depend only on the data and the settings, never on how many processes run them.
* Each batch is decoded with ``model.diffusion_generate`` under a generator seeded from ``(seed, the batch's
  ids)``, so a batch gives the same rows whichever process runs it, and whether or not it is a rerun.
* Each finished batch is written at once as one parquet shard (written to a temporary name, then renamed),
  so a crash or Ctrl-C loses at most the batch in flight. A rerun with the same ``output_dir`` skips the
  batches already written; it refuses to resume when the settings differ from the ones the folder was
  started with, naming each difference.
* Several processes (``accelerate launch`` / ``torchrun``, one per GPU, or several CPU processes) take
  every ``world_size``-th batch; the main process then merges the shards in source order, applies the
  filters, and saves the dataset into ``output_dir`` (``save_to_disk`` layout), where
  :func:`t3d_trl.load_trajectories` reads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from ..generation.configuration import DiffusionGenerationConfig
from ..generation.sampler import eos_token_ids, left_pad
from .prompts import encode_prompts, format_user_message
from .schema import TRAJECTORY_COLUMNS, TrajectoryMetadata, validate_trajectories

logger = logging.getLogger(__name__)

MANIFEST = "collection.json"
SHARD_DIR = "shards"


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
        raise KeyError(
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
    max_prompt_length: int | None = None,
) -> list[PromptRow]:
    """Render and tokenise the prompt of every source row (see :func:`collect_trajectories` for the arguments).

    The prompt text is tokenised without adding special tokens: the chat template already holds them, so
    ``prompt_ids`` is exactly the tokenisation of ``prompt``.
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
    skipped = 0
    for index, row in enumerate(tqdm(dataset, desc="tokenising prompts", unit="prompt", leave=False)):
        if chat_column is not None:
            text = tokenizer.apply_chat_template(row[chat_column], tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # the template holds its specials
        else:
            message = _user_message(row, prompt_template, prompt_column)
            [text], [ids] = encode_prompts(tokenizer, [message], use_chat_template)
        if max_prompt_length is not None and len(ids) > max_prompt_length:
            skipped += 1
            continue
        row_id = str(row[id_column]) if id_column is not None else str(index)
        if row_id in seen:
            raise ValueError(
                f"id {row_id!r} appears twice (rows {seen[row_id]} and {index}); ids must be unique"
            )
        seen[row_id] = index
        prompts.append(PromptRow(index, row_id, text, list(ids), {c: row[c] for c in keep}))
    if skipped:
        logger.warning(
            "skipped %d prompts longer than max_prompt_length=%d tokens", skipped, max_prompt_length
        )
    return prompts


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
    saved = json.loads(path.read_text())
    # A newer package version may resume an older collection; everything else must match.
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


def _teacher_settings(
    model: Any,
    tokenizer: Any,
    config: DiffusionGenerationConfig,
    *,
    seed: int,
    prompt_template: str,
    use_chat_template: bool,
    teacher_revision: str | None,
) -> tuple[DiffusionGenerationConfig, TrajectoryMetadata]:
    """The decoding settings with every default the sampler would look up made explicit, and the metadata."""
    from .. import __version__

    diffusion = model.diffusion_config
    block_length, steps_per_block = config.resolve(
        diffusion.block_size if diffusion.is_block_causal else None
    )
    eos_ids = eos_token_ids(model, config) or (
        [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    )
    if not eos_ids:
        logger.warning("no EOS token known: every completion will run to max_new_tokens")
    config = config.update(
        block_length=block_length, eos_token_id=eos_ids, return_dict_in_generate=True, output_history=False
    )
    if config.cache != "none":
        logger.warning(
            f"cache={config.cache!r} is approximate: later steps of a block see keys/values computed at its first "
            "step, so the trajectories are not the teacher's exact decoding (the metadata records it)"
        )
    chat = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template and not chat:
        logger.warning("the tokenizer has no chat template: prompts are the raw user messages")
    output_embeddings = model.get_output_embeddings()
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
        # The number of logits bounds every id the teacher can emit (the tokenizer may count fewer).
        vocab_size=output_embeddings.weight.shape[0] if output_embeddings is not None else len(tokenizer),
        eos_token_ids=eos_ids,
        t3d_trl_version=__version__,
        threshold=config.threshold,
        schedule=config.schedule,
        cache=config.cache,
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
        max_prompt_length: drop prompts longer than this many tokens (logged).
        filter_unfinished: drop completions that hit ``max_new_tokens`` without EOS.
        gold_column: keep only completions whose final answer matches this column
            (:func:`t3d_trl.evaluation.math_checker.check_math`); the column is passed through.
        seed: seeds every batch's generator together with the batch's ids.
        teacher_revision: Hub revision of the teacher (also used to load it by name).
        model_kwargs: ``from_pretrained`` keyword arguments when ``model`` is a name (``dtype``, ...).

    Returns:
        The trajectory dataset, in source order, with its :class:`TrajectoryMetadata` attached (every
        process gets it).
    """
    model, tokenizer = _resolve_model(model, tokenizer, teacher_revision, model_kwargs or {})
    if isinstance(dataset, datasets.DatasetDict):
        raise TypeError(f"pass one split of the DatasetDict (it has {list(dataset)}), e.g. dataset['train']")
    if not isinstance(dataset, datasets.Dataset):
        dataset = datasets.Dataset.from_list(list(dataset))
    if gold_column is not None:
        if gold_column not in dataset.column_names:
            raise ValueError(
                f"gold_column={gold_column!r} is not a column of the dataset ({dataset.column_names})"
            )
        if keep_columns is not None and gold_column not in keep_columns:
            keep_columns = [*keep_columns, gold_column]
    prompts = build_prompts(
        dataset,
        tokenizer,
        prompt_template,
        prompt_column=prompt_column,
        id_column=id_column,
        chat_column=chat_column,
        use_chat_template=use_chat_template,
        keep_columns=keep_columns,
        max_prompt_length=max_prompt_length,
    )
    if not prompts:
        raise ValueError("no prompts to collect (the dataset is empty or every prompt was too long)")
    keep = list(prompts[0].extra)

    config, metadata = _teacher_settings(
        model,
        tokenizer,
        generation_config or model.diffusion_generation_config,
        seed=seed,
        prompt_template=f"chat:{chat_column}" if chat_column else prompt_template,
        use_chat_template=use_chat_template,
        teacher_revision=teacher_revision,
    )
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
    _check_manifest(output_dir, manifest, rank == 0, barrier)
    features = _features(dataset, keep)

    mine = [(i, b) for i, b in enumerate(batches) if i % world_size == rank]
    todo = [(i, b) for i, b in mine if not _shard_path(output_dir, i).exists()]
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
    for index, batch in todo:
        rows = _generate_batch(model, tokenizer, batch, config, seed, pad_id)
        _write_shard(_shard_path(output_dir, index), rows, features)
        new_tokens += sum(len(r["completion_ids"]) for r in rows)
        bar.update(len(batch))
        elapsed = time.perf_counter() - start
        bar.set_postfix(tokens_per_s=f"{new_tokens / elapsed:.1f}")
    bar.close()

    barrier()
    if rank == 0:
        merged = merge_shards(
            output_dir,
            batches,
            features,
            metadata,
            filter_unfinished=filter_unfinished,
            gold_column=gold_column,
        )
        _save(merged, output_dir)
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
) -> datasets.Dataset:
    """Read every batch's shard, restore source order, validate rows and apply the filters."""
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
    order = sorted(range(table.num_rows), key=lambda r: position[ids[r]])
    dataset = datasets.Dataset(table.take(pa.array(order)), info=datasets.DatasetInfo(features=features))
    metadata.attach(dataset)
    total = len(dataset)
    # The teacher's own rows should all be valid; a sampler defect is logged and its rows dropped.
    dataset = validate_trajectories(dataset, metadata, skip_invalid=True)
    if filter_unfinished:
        dataset = dataset.filter(
            lambda finished: finished, input_columns="finished", desc="dropping unfinished"
        )
    if gold_column is not None:
        from ..evaluation.math_checker import check_math  # imported lazily: math-verify is slow to import

        keep = [
            i
            for i, (completion, gold) in enumerate(zip(dataset["completion"], dataset[gold_column]))
            if gold is not None and check_math(completion, str(gold))
        ]
        dataset = dataset.select(keep)
    if len(dataset) != total:
        logger.info("kept %d of %d trajectories after filtering", len(dataset), total)
    return dataset


def _save(dataset: datasets.Dataset, output_dir: Path) -> None:
    # Save beside, then move into place: a dataset memory-mapped from an earlier save keeps its old files.
    staging = output_dir / ".saving"
    shutil.rmtree(staging, ignore_errors=True)
    dataset.save_to_disk(str(staging))
    for item in staging.iterdir():
        os.replace(item, output_dir / item.name)
    staging.rmdir()
