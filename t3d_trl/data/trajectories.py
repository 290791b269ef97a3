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
  ones the folder was started with, naming each difference. More prompts after the saved ones (a larger
  ``limit``) extend the collection: its batches are kept and only the new prompts are decoded
  (:func:`~t3d_trl.data.shards.collection_parts`).
* Several processes (``accelerate launch`` / ``torchrun``, one per GPU, or several CPU processes) take
  every ``world_size``-th batch; the main process then merges the shards in source order, adds the source
  columns (taken from the source as it is now: shards hold the decoded columns only), applies the filters,
  and saves the dataset into ``output_dir`` (``save_to_disk`` layout), where
  :func:`t3d_trl.load_trajectories` reads it. No row is dropped without being counted: the counts of
  prompts, rows and rows dropped by each rule are stored in ``collection.json`` (:func:`collection_summary`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from tqdm.auto import tqdm

from ..diffusion.config import require_diffusion_config
from ..diffusion.forward import checked_vocab_size, max_positions
from ..generation.configuration import DiffusionGenerationConfig
from ..generation.memory import auto_batch_size, peak_memory_gb, reset_peak_memory
from ..generation.sampler import eos_token_ids, left_pad
from ..utils import check_process_count
from ..version import __version__
from .processes import is_first_process, process_group, smallest_over_processes
from .prompts import PromptRow, build_prompts, check_known_tokens, drop_long_prompts
from .schema import TrajectoryMetadata
from .shards import (
    SHARD_DIR,
    check_manifest,
    check_output_dir,
    collection_parts,
    collection_summary,
    merge_shards,
    prompts_digest,
    rows_problem,
    save_dataset,
    saved_batch_size,
    shard_path,
    shard_problem,
    teacher_name,
    write_shard,
    write_summary,
)

logger = logging.getLogger(__name__)


def plan_batches(
    prompts: Sequence[PromptRow], batch_size: int, parts: Sequence[int] | None = None
) -> list[list[PromptRow]]:
    """Sort prompts by length (longest first, ties in source order) and cut them into batches.

    ``parts`` (the ends of consecutive slices of ``prompts``; default: one slice) plans each slice on its own, one
    after the other: a collection extended with more prompts keeps the batches of the prompts it had.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    bounds = [0, *(parts or [len(prompts)])]
    batches = []
    for start, end in zip(bounds, bounds[1:]):
        ordered = sorted(prompts[start:end], key=lambda p: (-len(p.prompt_ids), p.index))
        batches += [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    return batches


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
            }
        )
    return rows


def _resolve_model(
    model: Any, tokenizer: Any, revision: str | None, model_kwargs: Mapping[str, Any]
) -> tuple[Any, Any]:
    """Load a teacher given by name (onto this process's GPU, if any) and its tokenizer."""
    from ..models.auto import load_tokenizer

    # A tokenizer that ships its own code needs the permission its model was given.
    remote = {"trust_remote_code": True} if model_kwargs.get("trust_remote_code") else {}
    if isinstance(model, str):
        from ..models.auto import AutoModelForDiffusionLM

        name = model
        model = AutoModelForDiffusionLM.from_pretrained(name, revision=revision, **model_kwargs)
        if torch.cuda.is_available() and "device_map" not in model_kwargs:
            model.to(torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))))
        if tokenizer is None:
            tokenizer = load_tokenizer(name, revision=revision, **remote)
    if tokenizer is None:
        tokenizer = getattr(model, "name_or_path", None)
        if not tokenizer:
            raise ValueError("pass a tokenizer: the model has no name or path to load one from")
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer, **remote)
    return model.eval(), tokenizer


def _check_teacher(model: Any, tokenizer: Any) -> int:
    """Refuse a teacher that cannot decode with this tokenizer, before any work; returns its vocabulary size."""
    diffusion = require_diffusion_config(model)
    if not hasattr(model, "diffusion_generate"):
        raise ValueError(
            f"{type(model).__name__} has a diffusion description but no diffusion_generate: load it with "
            "AutoModelForDiffusionLM.from_pretrained, or call add_diffusion_generation(model) first"
        )
    vocab = checked_vocab_size(model, diffusion)  # the tokenizer may count fewer tokens, never more
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if len(tokenizer) > vocab:
        raise ValueError(
            f"the tokenizer {name!r} has {len(tokenizer)} tokens but the model "
            f"{getattr(model, 'name_or_path', '') or type(model).__name__!r} has a vocabulary of {vocab}: pass "
            "the teacher's own tokenizer"
        )
    return vocab


@dataclass
class _PromptOptions:
    """How :func:`collect_trajectories` turns source rows into prompts (see its arguments)."""

    template: str
    prompt_column: str
    id_column: str | None
    chat_column: str | None
    use_chat_template: bool
    keep_columns: Sequence[str] | None
    max_prompt_length: int | None

    def build(
        self, dataset: datasets.Dataset, tokenizer: Any, model: Any, max_new_tokens: int
    ) -> tuple[list[PromptRow], dict[str, int]]:
        """The prompts that fit (:func:`build_prompts`, :func:`drop_long_prompts`) and the counts dropped."""
        prompts = build_prompts(
            dataset,
            tokenizer,
            self.template,
            prompt_column=self.prompt_column,
            id_column=self.id_column,
            chat_column=self.chat_column,
            use_chat_template=self.use_chat_template,
            keep_columns=self.keep_columns,
        )
        check_known_tokens([p.prompt_ids for p in prompts], tokenizer)
        prompts, dropped = drop_long_prompts(
            prompts, self.max_prompt_length, max_positions(model), max_new_tokens
        )
        if not prompts:
            raise ValueError(f"no prompts to collect: all {len(dataset)} were dropped ({', '.join(dropped)})")
        return prompts, dropped

    def manifest(
        self,
        model: Any,
        metadata: TrajectoryMetadata,
        config: DiffusionGenerationConfig,
        prompts: Sequence[PromptRow],
        batch_size: int,
        parts: Sequence[int],
    ) -> dict[str, Any]:
        """What ``collection.json`` records: a rerun resumes only with the same teacher, settings and prompts (or
        more prompts after them: :func:`~t3d_trl.data.shards.collection_parts`)."""
        return {
            # The teacher's name alone misses a model built in memory (no name) or retrained in place.
            "teacher_weights": weights_fingerprint(model),
            "metadata": metadata.to_dict(),
            "generation_config": config.to_dict(),
            "collection": {
                "batch_size": batch_size,
                "prompt_column": self.prompt_column,
                "id_column": self.id_column,
                "chat_column": self.chat_column,
                "max_prompt_length": self.max_prompt_length,
                "num_prompts": len(prompts),
                "prompts_sha256": prompts_digest(prompts),
                "parts": list(parts),
            },
        }


def weights_fingerprint(model: torch.nn.Module, samples: int = 64) -> str:
    """A digest of a model's weights that tells two teachers apart without reading every value: the name, shape
    and ``samples`` evenly spaced values of each parameter (the same on every device; offloaded ``meta``
    parameters count by name and shape)."""
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        digest.update(f"{name}:{tuple(param.shape)}:{param.dtype};".encode())
        if param.is_meta or param.numel() == 0:
            continue
        flat = param.detach().reshape(-1)
        count = min(samples, flat.numel())
        index = torch.arange(count, device=flat.device) * (flat.numel() - 1) // max(count - 1, 1)
        digest.update(flat[index].float().cpu().numpy().tobytes())
    return digest.hexdigest()


def _hub_commit(name: str, revision: str | None) -> str | None:
    """The commit of Hub repo ``name`` at ``revision`` (a branch, tag or commit; default ``main``), read from the
    local cache ``from_pretrained`` loaded it from (transformers 5 no longer sets ``config._commit_hash``);
    ``None`` for a local folder or a revision not in the cache."""
    from huggingface_hub.errors import HFValidationError

    from ..models.auto import cached_checkpoint_file

    if not name or os.path.isdir(name):
        return None
    try:
        path = cached_checkpoint_file(name, revision=revision)
    except HFValidationError:  # not a repo id
        return None
    return None if path is None else Path(path).parent.name  # .../snapshots/<commit>/config.json


def _teacher_settings(
    model: Any,
    tokenizer: Any,
    config: DiffusionGenerationConfig,
    vocab: int,
    seed: int,
    options: _PromptOptions,
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
    limit = max_positions(model)
    if limit is not None and config.max_new_tokens >= limit:
        raise ValueError(
            f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt in the model's "
            f"max_position_embeddings={limit}"
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
    chat = options.use_chat_template and bool(getattr(tokenizer, "chat_template", None))
    if options.use_chat_template and not chat and options.chat_column is None:  # a chat column is refused
        logger.warning("the tokenizer has no chat template: prompts are the raw user messages")
    metadata = TrajectoryMetadata(
        teacher=teacher_name(getattr(model, "name_or_path", "") or "unknown"),
        teacher_revision=_hub_commit(getattr(model, "name_or_path", ""), teacher_revision)
        or teacher_revision,
        mask_token_id=diffusion.mask_token_id,
        attention=diffusion.attention,
        block_length=block_length,
        steps_per_block=steps_per_block,
        max_new_tokens=config.max_new_tokens,
        remasking=config.remasking,
        temperature=config.temperature,
        seed=seed,
        prompt_template=f"chat:{options.chat_column}" if options.chat_column else options.template,
        use_chat_template=chat,
        vocab_size=vocab,
        eos_token_ids=eos_ids,
        t3d_trl_version=__version__,
        threshold=config.threshold,
        schedule=config.schedule,
        cache=config.approximate_cache or "none",
    )
    return config, metadata


def _source_dataset(
    dataset: Any,
    keep_columns: Sequence[str] | None,
    gold_column: str | None,
    answer_checker: Callable[[str, str], bool] | None,
) -> tuple[datasets.Dataset, Sequence[str] | None]:
    """The source rows as one ``datasets.Dataset``, checked; ``keep_columns`` with ``gold_column`` added."""
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
    return dataset, keep_columns


@dataclass
class _BatchRun:
    """Decodes this process's batches into shards, skipping the shards already written and valid."""

    model: Any
    tokenizer: Any
    config: DiffusionGenerationConfig
    metadata: TrajectoryMetadata
    output_dir: Path
    seed: int
    peak_memory_gb: float | None = None  # this process's peak GPU memory while decoding (None off CUDA)

    def pending(self, mine: list[tuple[int, list[PromptRow]]]) -> list[tuple[int, list[PromptRow]]]:
        """The batches of ``mine`` without a valid shard (an invalid one is deleted, to be decoded again)."""
        todo = []
        for index, batch in mine:
            path = shard_path(self.output_dir, index)
            if path.exists():
                problem = shard_problem(path, batch, self.metadata)
                if problem is None:
                    continue
                logger.warning("shard %s fails validation (%s): decoding its batch again", path, problem)
                path.unlink()
            todo.append((index, batch))
        if len(todo) < len(mine):
            logger.info(
                "resuming: %d of %d batches of this process already written", len(mine) - len(todo), len(mine)
            )
        return todo

    def decode(
        self, mine: list[tuple[int, list[PromptRow]]], num_batches: int, rank: int, world_size: int
    ) -> None:
        """Decode and write every pending batch of ``mine``; Ctrl-C says how much is saved (a rerun resumes)."""
        todo = self.pending(mine)
        config, tokenizer = self.config, self.tokenizer
        pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (config.eos_token_id or [0])[0]
        )
        bar = tqdm(
            total=sum(len(b) for _, b in mine),
            initial=sum(len(b) for _, b in mine) - sum(len(b) for _, b in todo),
            unit="prompt",
            desc="collecting trajectories" + (f" (process {rank}/{world_size})" if world_size > 1 else ""),
            disable=rank != 0,
        )
        start, new_tokens = time.perf_counter(), 0
        device = next(self.model.parameters()).device
        reset_peak_memory(device)
        try:
            for index, batch in todo:
                rows = _generate_batch(self.model, tokenizer, batch, config, self.seed, pad_id)
                problem = rows_problem(rows, batch, self.metadata)
                if problem is not None:  # the teacher's own rows are valid unless the sampler has a defect
                    raise RuntimeError(
                        f"shard {shard_path(self.output_dir, index)} (batch {index}) fails validation right after "
                        f"decoding, so it was not written: {problem}"
                    )
                write_shard(shard_path(self.output_dir, index), rows)
                new_tokens += sum(len(r["completion_ids"]) for r in rows)
                bar.update(len(batch))
                bar.set_postfix(tokens_per_s=f"{new_tokens / (time.perf_counter() - start):.1f}")
        except KeyboardInterrupt:
            written = sum(shard_path(self.output_dir, i).exists() for i in range(num_batches))
            if is_first_process():  # every process is interrupted; one message
                logger.warning(
                    "interrupted: %d of %d batches are saved in %s; the same call with the same output_dir resumes",
                    written,
                    num_batches,
                    self.output_dir / SHARD_DIR,
                )
            raise
        finally:
            bar.close()
        self.peak_memory_gb = peak_memory_gb(device)
        if self.peak_memory_gb is not None:
            logger.info("peak GPU memory while decoding: %.2f GiB", self.peak_memory_gb)

    def merge(
        self,
        batches: Sequence[Sequence[PromptRow]],
        source: datasets.Dataset,
        dropped: dict[str, int],
        filter_unfinished: bool,
        gold_column: str | None,
        answer_checker: Callable[[str, str], bool] | None,
    ):
        """Merge every shard, with the source columns the prompts carry, into the dataset of ``output_dir`` (main
        process), apply the filters and record the counts."""
        features = datasets.Features({c: source.features[c] for c in batches[0][0].extra})
        merged, filtered = merge_shards(
            self.output_dir,
            batches,
            features,
            self.metadata,
            filter_unfinished=filter_unfinished,
            gold_column=gold_column,
            answer_checker=answer_checker,
        )
        save_dataset(merged, self.output_dir)
        summary = {"prompts": len(source), "rows": len(merged), "dropped": {**dropped, **filtered}}
        if self.peak_memory_gb is not None:
            summary["peak_memory_gb"] = round(self.peak_memory_gb, 2)
        write_summary(self.output_dir, summary)
        logger.info(collection_summary(self.output_dir))


def collection_batch_size(
    model: Any, config: DiffusionGenerationConfig, prompts: Sequence[PromptRow], output_dir: Path
) -> int:
    """The batch size of ``batch_size=None``: on a resume, the one the collection started with (the batches must
    not change); else from the free GPU memory for the longest prompt's canvas (8 on the CPU), the smallest over
    the processes, since every process must plan the same batches."""
    saved = saved_batch_size(output_dir)
    if saved is not None:
        logger.info("batch size %d (the collection's own, resuming)", saved)
        return saved
    longest = max(len(p.prompt_ids) for p in prompts)
    batch_size = smallest_over_processes(auto_batch_size(model, config, longest))
    logger.info("batch size %d (from free accelerator memory)", batch_size)
    return batch_size


def collect_trajectories(
    model: Any,
    tokenizer: Any,
    dataset: datasets.Dataset | Sequence[Mapping[str, Any]],
    prompt_template: str = "math",
    *,
    output_dir: str | os.PathLike,
    generation_config: DiffusionGenerationConfig | Mapping[str, Any] | None = None,
    batch_size: int | None = 8,
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
            over the columns; its ``{problem}`` field reads ``prompt_column``. Literal braces are doubled
            (``\\boxed{{}}``).
        output_dir: where shards are written as the collection goes and the final dataset is saved
            (``save_to_disk`` layout). Rerunning with the same folder resumes (with more rows after its own: extends
            it). A folder holding another saved dataset is refused.
        generation_config: teacher decoding settings; ``None``: the defaults saved with the model. The paper
            uses ``DiffusionGenerationConfig(block_length=4, tokens_per_step=1)`` (4 steps per block).
        batch_size: prompts decoded together (sorted by length, longest first, to limit padding). ``None``: as
            many as the free GPU memory holds (up to 128; 8 on the CPU; the smallest over the processes), or on a
            resume the batch size the collection started with. On CUDA the peak memory is reported in the
            collection summary.
        prompt_column: the column that fills the template's ``{problem}``.
        id_column: a column of unique row ids; default: ``id`` when the dataset has one, else the row index.
        chat_column: a column of chat messages (``[{"role": ..., "content": ...}]``) used instead of the
            template, wrapped by the tokenizer's chat template.
        use_chat_template: wrap the user message with the tokenizer's chat template (when it has one).
        keep_columns: source columns copied into each row; default: all but the trajectory columns. They are
            taken from ``dataset`` when the shards are merged, so a rerun may change them and their values.
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
    output_dir = Path(output_dir)
    check_output_dir(output_dir)
    model, tokenizer = _resolve_model(model, tokenizer, teacher_revision, model_kwargs or {})
    vocab = _check_teacher(model, tokenizer)
    dataset, keep_columns = _source_dataset(dataset, keep_columns, gold_column, answer_checker)
    options = _PromptOptions(
        prompt_template,
        prompt_column,
        id_column,
        chat_column,
        use_chat_template,
        keep_columns,
        max_prompt_length,
    )
    # Settings are checked against the model before the (possibly long) tokenisation and any decoding.
    config = DiffusionGenerationConfig.parse(generation_config) or model.diffusion_generation_config
    config, metadata = _teacher_settings(model, tokenizer, config, vocab, seed, options, teacher_revision)
    prompts, dropped = options.build(dataset, tokenizer, model, config.max_new_tokens)
    rank, world_size, barrier = process_group()
    check_process_count(world_size, "collection", "each process would decode every prompt")
    if batch_size is None:
        batch_size = collection_batch_size(model, config, prompts, output_dir)
    parts = collection_parts(output_dir, prompts)
    batches = plan_batches(prompts, batch_size, parts)
    manifest = options.manifest(model, metadata, config, prompts, batch_size, parts)
    check_manifest(output_dir, manifest, rank == 0, barrier)
    run = _BatchRun(model, tokenizer, config, metadata, output_dir, seed)
    run.decode(
        [(i, b) for i, b in enumerate(batches) if i % world_size == rank], len(batches), rank, world_size
    )
    barrier()
    if rank == 0:
        run.merge(batches, dataset, dropped, filter_unfinished, gold_column, answer_checker)
    barrier()
    return datasets.load_from_disk(str(output_dir))
