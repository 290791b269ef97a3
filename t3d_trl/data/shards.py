"""The folder of a trajectory collection: its manifest, its shards, and the merged dataset built from them.

``output_dir/collection.json`` (the manifest) holds the settings the collection was started with, and after a merge
the counts of prompts, rows and dropped rows. ``output_dir/shards/batch-NNNNNN.parquet`` holds one decoded batch
each, written atomically. The merged dataset (``save_to_disk`` layout: ``data-*.arrow``, ``dataset_info.json``,
``state.json``) is rebuilt from the shards by every run that finishes, so rerunning a collection into the same
folder repairs a damaged dataset file as long as the shards are there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq

from ..generation.configuration import DiffusionGenerationConfig
from ..utils import write_atomically
from .prompts import PromptRow
from .schema import TrajectoryMetadata, row_problem

logger = logging.getLogger(__name__)

MANIFEST = "collection.json"
SHARD_DIR = "shards"
SUMMARY_KEY = "summary"  # the manifest entry holding the counts of the last merge (not a setting)


_IDS = datasets.List(datasets.Value("int32"))
#: What a shard holds: the decoded columns. The source columns are taken from the source at every merge, so a
#: rerun passes through (and filters on) the current source values, and may keep other columns.
SHARD_FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "prompt": datasets.Value("string"),
        "prompt_ids": _IDS,
        "completion_ids": _IDS,
        "decode_step": _IDS,
        "finished": datasets.Value("bool"),
        "completion": datasets.Value("string"),
    }
)


def write_shard(path: Path, rows: list[dict[str, Any]]) -> None:
    schema = SHARD_FEATURES.arrow_schema
    table = pa.Table.from_pylist([SHARD_FEATURES.encode_example(r) for r in rows], schema=schema)
    write_atomically(path, lambda tmp: pq.write_table(table, tmp))  # a shard is either complete or absent


def shard_path(output_dir: Path, batch_index: int) -> Path:
    return output_dir / SHARD_DIR / f"batch-{batch_index:06d}.parquet"


def rows_problem(
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


def shard_problem(path: Path, batch: Sequence[PromptRow], metadata: TrajectoryMetadata) -> str | None:
    """What is wrong with a written shard, or ``None`` when it holds exactly its batch's valid rows."""
    try:
        missing = [name for name in SHARD_FEATURES if name not in pq.read_schema(path).names]
        if missing:  # read with the schema, they would come back as nulls
            return f"it lacks column(s) {missing}"
        # Read with the schema: the source columns that older shards also hold are left out.
        table = pq.read_table(path, schema=SHARD_FEATURES.arrow_schema)
    except (pa.ArrowException, OSError, ValueError, KeyError) as err:  # truncated, other columns or types
        return f"it cannot be read with the collection's columns ({type(err).__name__}: {err})"
    return rows_problem(table.to_pylist(), batch, metadata)


def _differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        out: list[str] = []
        for key in sorted(set(saved) | set(current)):
            out += _differences(saved.get(key), current.get(key), f"{prefix}{key}.")
        return out
    return [] if saved == current else [f"{prefix[:-1]}: {saved!r} (saved) != {current!r} (now)"]


def teacher_name(name: str) -> str:
    """How a teacher is recorded: a local folder by its absolute path (``teacher/``, ``./teacher`` and
    ``/abs/teacher`` are one teacher), a Hub id as it is."""
    return os.path.abspath(name) if os.path.isdir(name) else name


def saved_dataset_file(folder: Path) -> str | None:
    """The file ``save_to_disk`` wrote into ``folder`` (``state.json``: a ``Dataset``; ``dataset_dict.json``: a
    ``DatasetDict``), ``None`` when it holds neither."""
    return next((name for name in ("state.json", "dataset_dict.json") if (folder / name).is_file()), None)


def check_output_dir(output_dir: Path) -> None:
    """Refuse a folder holding a saved dataset that is not a collection: the merge would overwrite it."""
    saved = saved_dataset_file(output_dir)
    if saved and not (output_dir / MANIFEST).is_file():
        raise ValueError(
            f"output_dir {output_dir} holds a saved dataset ({saved}) that is not a trajectory collection (no "
            f"{MANIFEST}): the collection would overwrite it; use another output_dir"
        )


def saved_batch_size(output_dir: Path) -> int | None:
    """The batch size the collection in ``output_dir`` started with; ``None`` when there is none (or it cannot be
    read, which :func:`check_manifest` reports)."""
    try:
        return int(json.loads((output_dir / MANIFEST).read_text())["collection"]["batch_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prompts_digest(prompts: Sequence[PromptRow]) -> str:
    """A digest of the prompts of a collection, in source order (their ids and texts)."""
    return hashlib.sha256(json.dumps([[p.id, p.prompt] for p in prompts]).encode()).hexdigest()


def collection_parts(output_dir: Path, prompts: Sequence[PromptRow]) -> list[int]:
    """Where the batch plan of a collection into ``output_dir`` is cut (:func:`plan_batches`' ``parts``).

    A new collection is one part. A rerun with more prompts whose first ones are exactly the saved collection's
    (a larger ``limit`` over the same source) extends it: the saved parts keep their batches, so their shards stay
    valid, and the new prompts are planned after them. Anything else keeps the saved parts, and
    :func:`check_manifest` names what differs.
    """
    try:
        saved = json.loads((output_dir / MANIFEST).read_text())["collection"]
        count, parts = int(saved["num_prompts"]), list(saved.get("parts") or [saved["num_prompts"]])
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: check_manifest says which
        return [len(prompts)]
    if count < len(prompts) and prompts_digest(prompts[:count]) == saved.get("prompts_sha256"):
        return [*parts, len(prompts)]
    return parts if count == len(prompts) else [len(prompts)]


def check_manifest(output_dir: Path, manifest: dict[str, Any], is_main: bool, barrier: Any) -> None:
    path = output_dir / MANIFEST
    if is_main:
        output_dir.joinpath(SHARD_DIR).mkdir(parents=True, exist_ok=True)
        for stale in output_dir.joinpath(SHARD_DIR).glob(".*.tmp"):  # a shard interrupted while written
            stale.unlink()
        # A merge killed while saving leaves a whole copy of the dataset in its staging folder, and a manifest
        # write its staging file: nothing reads them, and each interrupted merge would add one.
        for stale in output_dir.glob(".saving-*"):
            shutil.rmtree(stale, ignore_errors=True)
        for stale in output_dir.glob(f".{MANIFEST}.*.tmp"):
            stale.unlink()
        if not path.exists():
            write_atomically(path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=2)))
    barrier()
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path} is not valid JSON ({err}): delete {output_dir} to start the collection over"
        ) from err
    # A newer package version may resume an older collection; everything else must match.
    summary = saved.pop(SUMMARY_KEY, None)  # the counts of an earlier merge are not a setting
    saved["metadata"].pop("t3d_trl_version", None)
    if isinstance(saved.get("generation_config"), dict):
        # A collection saved before a decoding setting existed (e.g. cfg_scale) was decoded with its default.
        defaults = DiffusionGenerationConfig().to_dict()
        saved["generation_config"] = {**defaults, **saved["generation_config"]}
    # Collections started before these were normalised or taken from the source at the merge.
    saved["metadata"]["teacher"] = teacher_name(saved["metadata"]["teacher"])
    saved.get("collection", {}).pop("keep_columns", None)
    if isinstance(saved.get("collection"), dict):  # started before extensions were planned in parts: one part
        saved["collection"].setdefault("parts", [saved["collection"].get("num_prompts")])
    current = json.loads(json.dumps(manifest))
    current["metadata"].pop("t3d_trl_version", None)
    if "teacher_weights" not in saved:  # a collection started before the fingerprint was recorded
        current.pop("teacher_weights", None)
    if not re.fullmatch(r"[0-9a-f]{40}", str(saved["metadata"].get("teacher_revision"))):
        # Recorded before Hub commits were resolved (a branch name, or none): the weights fingerprint checks it.
        saved["metadata"].pop("teacher_revision", None)
        current["metadata"].pop("teacher_revision", None)
    extended = _extension(saved, current)
    if extended:  # more prompts after the saved ones (collection_parts): the rest must match
        saved["collection"] = {**saved["collection"], **extended}
    diffs = _differences(saved, current)
    if extended and not diffs:
        logger.info(
            "extending the collection in %s from %d to %d prompts: the batches of the first %d are kept",
            output_dir,
            current["collection"]["parts"][-2],
            current["collection"]["num_prompts"],
            current["collection"]["parts"][-2],
        )
        if is_main:  # the dataset merged last, and its counts, stay until the larger one is merged
            grown = {**manifest, SUMMARY_KEY: summary} if summary is not None else manifest
            write_atomically(path, lambda tmp: tmp.write_text(json.dumps(grown, indent=2)))
    if diffs:
        raise ValueError(
            f"{output_dir} holds a collection started with other settings; refusing to resume. Differences:\n  "
            + "\n  ".join(diffs)
            + "\nUse another output_dir, or delete this one to start over."
        )


def _extension(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, Any] | None:
    """The collection entries that grow when ``current`` extends ``saved`` with more prompts, else ``None``."""
    before, now = saved.get("collection"), current.get("collection")
    if not isinstance(before, dict) or not isinstance(now, dict) or not before.get("parts"):
        return None
    if now.get("parts") != [*before["parts"], now.get("num_prompts")]:
        return None
    return {key: now.get(key) for key in ("num_prompts", "prompts_sha256", "parts")}


def merge_shards(
    output_dir: Path,
    batches: Sequence[Sequence[PromptRow]],
    source_features: datasets.Features,
    metadata: TrajectoryMetadata,
    *,
    filter_unfinished: bool = False,
    gold_column: str | None = None,
    answer_checker: Callable[[str, str], bool] | None = None,
) -> tuple[datasets.Dataset, dict[str, int]]:
    """Read every batch's (validated) shard, restore source order, add the source columns and apply the filters.

    The decoded columns come from the shards, the source columns (``source_features``) from the prompts of this
    run, so a rerun filters on the source as it is now. ``gold_column`` keeps the rows whose completion
    ``answer_checker(completion, gold)`` accepts.

    Returns the dataset and ``{rule: rows dropped}`` for the filters that dropped rows.
    """
    missing = [i for i in range(len(batches)) if not shard_path(output_dir, i).exists()]
    if missing:
        raise RuntimeError(
            f"{len(missing)} batches have no shard in {output_dir / SHARD_DIR} (first: {missing[0]})"
        )
    table = pa.concat_tables(
        [
            pq.read_table(shard_path(output_dir, i), schema=SHARD_FEATURES.arrow_schema)
            for i in range(len(batches))
        ]
    )
    prompts = {p.id: p for batch in batches for p in batch}
    ids = table.column("id").to_pylist()
    foreign = sorted(set(ids) - prompts.keys())
    if foreign:
        raise ValueError(
            f"the shards in {output_dir / SHARD_DIR} hold ids that are not prompts of this collection "
            f"({foreign[:5]}): they come from another collection; delete {output_dir} to start over"
        )
    order = sorted(range(table.num_rows), key=lambda r: prompts[ids[r]].index)
    table = table.take(pa.array(order))
    source = pa.Table.from_pylist(
        [source_features.encode_example(prompts[ids[r]].extra) for r in order],
        schema=source_features.arrow_schema,
    )
    for field, column in zip(source.schema, source.columns):
        table = table.append_column(field, column)
    features = datasets.Features({**SHARD_FEATURES, **source_features})
    dataset = datasets.Dataset(table, info=datasets.DatasetInfo(features=features))
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


def write_summary(output_dir: Path, summary: dict[str, Any]) -> None:
    path = output_dir / MANIFEST
    manifest = json.loads(path.read_text())
    manifest[SUMMARY_KEY] = summary
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=2)))  # merges may overlap


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
    peak = f", peak GPU memory {summary['peak_memory_gb']} GiB" if "peak_memory_gb" in summary else ""
    return (
        f"{summary['prompts']} prompts, {summary['rows']} trajectories saved to {output_dir}, "
        + (f"{sum(dropped.values())} dropped: {detail}" if dropped else "none dropped")
        + peak
    )


def save_dataset(dataset: datasets.Dataset, output_dir: Path) -> None:
    # Save beside, then move into place: a dataset memory-mapped from an earlier save keeps its old files. The
    # staging folder is this call's own, so two processes finishing one collection cannot delete each other's.
    staging = Path(tempfile.mkdtemp(prefix=".saving-", dir=output_dir))
    try:
        # One data file even for 0 rows (filters dropped every row): datasets cannot load a save without one.
        dataset.save_to_disk(str(staging), num_shards=None if len(dataset) else 1)
        for item in staging.iterdir():
            os.replace(item, output_dir / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
