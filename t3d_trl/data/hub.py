"""Trajectory datasets on disk and on the Hugging Face Hub: load (with validation), card, push.

The :class:`TrajectoryMetadata` of a dataset travels three ways: attached to the ``datasets.Dataset``
(``dataset.info.description``, kept by ``save_to_disk``), and in the dataset card on the Hub, both as a YAML
entry (``trajectory_metadata:``, what :func:`load_trajectories` reads back) and as a readable table.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import datasets
from huggingface_hub import DatasetCard, DatasetCardData

from ..utils import load_data_folder
from .schema import METADATA_KEY, TRAJECTORY_COLUMNS, TrajectoryMetadata, validate_trajectories
from .shards import MANIFEST, SHARD_DIR, collection_summary, saved_dataset_file

logger = logging.getLogger(__name__)

CARD_TAGS = ["t3d-trl", "diffusion-language-model", "trajectory-distillation"]

_COLUMN_DOCS = {
    "id": "identifier of the source row",
    "prompt": "the exact prompt text the teacher saw (after the chat template)",
    "prompt_ids": "its token ids",
    "completion_ids": "the teacher's completion, up to and including its first EOS when it finished",
    "decode_step": "per completion token, the global 1-based step at which the teacher unmasked it",
    "finished": "the completion ended with EOS (false: it hit `max_new_tokens`)",
    "completion": "the decoded completion text",
}


def trajectory_card(
    metadata: TrajectoryMetadata,
    repo_id: str,
    num_rows: int | None = None,
    extra_columns: list[str] | None = None,
    base: DatasetCard | None = None,
) -> DatasetCard:
    """A dataset card holding ``metadata`` in its YAML header and in readable text.

    Args:
        metadata: how the trajectories were produced.
        repo_id: the dataset's repo id (used in the usage snippet).
        num_rows: number of trajectories, shown when given.
        extra_columns: pass-through columns of the source dataset.
        base: an existing card whose YAML entries (``datasets``' ``dataset_info``/``configs``) are kept.
    """
    data = base.data.to_dict() if base is not None else {}
    data["tags"] = sorted(set(data.get("tags") or []) | set(CARD_TAGS))
    data[METADATA_KEY] = metadata.to_dict()
    rows = "\n".join(f"| `{key}` | `{value!r}` |" for key, value in metadata.to_dict().items())
    columns = "\n".join(f"| `{name}` | {doc} |" for name, doc in _COLUMN_DOCS.items())
    columns += "".join(
        f"\n| `{name}` | passed through from the source dataset |" for name in extra_columns or []
    )
    decoding = (
        f"dynamic decoding (threshold {metadata.threshold})"
        if metadata.dynamic
        else f"static decoding, {metadata.steps_per_block} steps per block"
    )
    size = f"{num_rows} trajectories" if num_rows is not None else "Trajectories"
    text = f"""
# Teacher trajectories of {metadata.teacher}

{size} of the masked diffusion language model `{metadata.teacher}`, collected with `t3d-trl` for
trajectory self-distillation (T3D): {metadata.attention} attention, blocks of {metadata.block_length} tokens, {decoding}, `{metadata.remasking}` remasking,
temperature {metadata.temperature}, at most {metadata.max_new_tokens} new tokens.

Each row holds one completion and the step at which the teacher unmasked each of its tokens, so the teacher's
intermediate states can be rebuilt exactly (mask every token whose step is later than the chosen step).

## Usage

```python
from t3d_trl import load_trajectories

dataset = load_trajectories("{repo_id}")  # validates every row and attaches the metadata below
```

## Columns

| column | content |
| --- | --- |
{columns}

## Collection metadata

Also stored in this card's YAML header under `{METADATA_KEY}`.

| field | value |
| --- | --- |
{rows}
"""
    return DatasetCard(f"---\n{DatasetCardData(**data).to_yaml()}\n---\n{text}")


def create_trajectory_repo(repo_id: str, *, private: bool | None = None, token: str | None = None) -> Any:
    """Create (or find) the dataset repo ``repo_id``; its ``RepoUrl``. ``t3d-trl collect --push_to_hub`` calls it
    before decoding, as the trainer does before training: no Hub access or no token fails at once, not after."""
    from huggingface_hub import HfApi

    return HfApi(token=token).create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)


def push_trajectories_to_hub(
    dataset: datasets.Dataset,
    repo_id: str,
    *,
    metadata: TrajectoryMetadata | None = None,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str = "Upload teacher trajectories with t3d-trl",
) -> str:
    """Create the dataset repo, push the data, and upload a card with the metadata. Returns the repo URL.

    ``metadata`` defaults to the one attached to ``dataset`` (as by :func:`t3d_trl.collect_trajectories`).
    """
    metadata = metadata or TrajectoryMetadata.from_dataset(dataset)
    if metadata is None:
        raise ValueError("the dataset carries no TrajectoryMetadata; pass metadata=...")
    if len(dataset) == 0:  # e.g. a collection whose filters dropped every row: a repo nobody can load from
        raise ValueError(f"the dataset has 0 rows: nothing to push to {repo_id}")
    url = create_trajectory_repo(repo_id, private=private, token=token)
    repo_id = url.repo_id  # "traj" lands in the token owner's namespace: the card must name "owner/traj"
    dataset.push_to_hub(repo_id, private=private, token=token, commit_message=commit_message)
    base = DatasetCard.load(repo_id, repo_type="dataset", token=token)  # the card `datasets` just wrote
    extra = [c for c in dataset.column_names if c not in TRAJECTORY_COLUMNS]
    card = trajectory_card(metadata, repo_id, len(dataset), extra, base=base)
    card.push_to_hub(repo_id, repo_type="dataset", token=token, commit_message="Trajectory dataset card")
    return str(url)


def _card_metadata(card_path: str | os.PathLike) -> TrajectoryMetadata | None:
    data = DatasetCard.load(Path(card_path)).data.to_dict().get(METADATA_KEY)
    return TrajectoryMetadata.from_dict(data) if data else None


def _damaged_files(folder: Path) -> list[tuple[Path, str]]:
    """The Arrow files under ``folder`` that cannot be read to the end, with pyarrow's reason."""
    import pyarrow as pa

    damaged = []
    for path in sorted(folder.rglob("*.arrow")):
        try:
            with pa.memory_map(str(path)) as source:
                pa.ipc.open_stream(source).read_all()
        except (pa.ArrowException, OSError) as err:
            damaged.append((path, " ".join(str(err).split())))
    return damaged


def _load_from_disk(folder: Path) -> datasets.Dataset | datasets.DatasetDict:
    """``datasets.load_from_disk``; a damaged (truncated) Arrow file is named, with the way to rebuild it."""
    import pyarrow as pa

    try:
        return datasets.load_from_disk(str(folder))
    except (pa.ArrowException, OSError) as err:
        damaged = _damaged_files(folder) or [(None, " ".join(str(err).split()))]
        named = "; ".join(
            f"{p.relative_to(folder) if p else 'a data file'} is damaged ({why})" for p, why in damaged
        )
        if (folder / MANIFEST).is_file() and (folder / SHARD_DIR).is_dir():
            cure = (
                "rerunning `t3d-trl collect` into the same folder rebuilds it from its shards (the same "
                "collect_trajectories call with this output_dir does too)"
            )
        else:
            cure = "it has no shards to rebuild it from (not a collection folder): save or download it again"
        raise ValueError(f"{folder}: {named}; {cure}") from err


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a folder written by ``save_to_disk`` (a ``Dataset`` or a ``DatasetDict``)."""
    return saved_dataset_file(path) is not None


def _empty(folder: Path) -> ValueError:
    why = ""
    if (folder / MANIFEST).is_file():  # a collection whose filters dropped every row: the summary says why
        with contextlib.suppress(ValueError):  # unfinished: no summary
            why = f" (the collection: {collection_summary(folder)})"
    return ValueError(f"{folder} holds an empty dataset (0 rows): there is nothing to load{why}")


def load_saved_dataset(folder: Path, split: str = "train") -> datasets.Dataset:
    """The ``split`` of a ``save_to_disk`` folder; an empty or damaged dataset, or a split it lacks, is refused in
    one line."""
    state = folder / "state.json"
    if state.exists() and not json.loads(state.read_text()).get("_data_files"):
        raise _empty(folder)  # datasets cannot load a saved dataset without data files (IndexError)
    dataset = _load_from_disk(folder)
    if isinstance(dataset, datasets.DatasetDict):
        if split not in dataset:
            raise ValueError(f"{folder} has splits {list(dataset)}, not {split!r}")
        dataset = dataset[split]
    elif split != "train":
        # One dataset is its "train" split: another name would silently read the same rows.
        raise ValueError(
            f"{folder} holds one dataset without splits (it reads as split 'train'), not split {split!r}: keep "
            "evaluation rows in a dataset of their own"
        )
    if len(dataset) == 0:
        raise _empty(folder)
    return dataset


def load_trajectories(
    path_or_repo_id: str | os.PathLike,
    split: str = "train",
    skip_invalid: bool = False,
    *,
    revision: str | None = None,
    token: str | None = None,
) -> datasets.Dataset:
    """Load a trajectory dataset, attach its :class:`TrajectoryMetadata`, and validate every row.

    Args:
        path_or_repo_id: a folder written by ``save_to_disk`` (e.g. the ``output_dir`` of a collection), a
            local folder of data files with a ``README.md`` card (a Hub snapshot), or a Hub dataset repo id.
        split: the split to load (a single saved ``Dataset`` is split ``train``: another name is refused).
        skip_invalid: drop rows that break the contract (and log how many) instead of raising.
        revision, token: for the Hub.

    Raises:
        ValueError: no metadata is found, a column is missing, or a row is invalid (naming its id and the
            problem) while ``skip_invalid`` is False.
    """
    path = Path(path_or_repo_id)
    card: str | os.PathLike | None = None
    if is_saved_dataset(path):
        dataset = load_saved_dataset(path, split)
    elif path.is_dir() and (path / MANIFEST).exists():
        raise ValueError(
            f"{path} holds an unfinished collection (shards but no merged dataset): run the same "
            "collect_trajectories call (or t3d-trl collect) again to finish and merge it"
        )
    elif path.is_dir():
        dataset = load_data_folder(path, split)
        card = path / "README.md" if (path / "README.md").exists() else None
    elif path.is_file():
        raise ValueError(
            f"{path} is a file: a trajectory dataset is a folder (save_to_disk, as collect_trajectories writes it, or "
            "data files with their README.md card) or a Hub dataset repo"
        )
    else:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id

        repo_id = str(path_or_repo_id)
        try:
            validate_repo_id(repo_id)
        except HFValidationError as err:
            raise FileNotFoundError(f"{repo_id}: no such folder (nor a valid Hub dataset repo id)") from err
        try:
            dataset = datasets.load_dataset(repo_id, split=split, revision=revision, token=token)
        except ConnectionError as err:  # datasets reports a missing folder as a failed Hub connection
            raise FileNotFoundError(
                f"{repo_id}: no such folder, and the Hub could not be reached ({err})"
            ) from err
        card = hf_hub_download(repo_id, "README.md", repo_type="dataset", revision=revision, token=token)
    metadata = TrajectoryMetadata.from_dataset(dataset) or (_card_metadata(card) if card else None)
    if metadata is None:
        raise ValueError(
            f"{path_or_repo_id} has no trajectory metadata (neither in the dataset info nor in a card's "
            f"{METADATA_KEY!r} entry): was it collected with t3d_trl.collect_trajectories?"
        )
    return validate_trajectories(metadata.attach(dataset), metadata, skip_invalid=skip_invalid)
