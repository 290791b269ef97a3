"""The results of an evaluation grid: ``results.json`` and ``samples/``, merging a rerun, resuming, fingerprints.

:func:`t3d_trl.evaluation.runner.run_grid` writes ``results.json`` after every run (atomically), so a rerun into
the same folder keeps every earlier result and skips the runs it already finished. A run counts as finished when
its *run key* (model path, benchmark, decoding setting, data file, limit, seeds, samples, generation settings,
chat template, dtype) matches an entry's and the model is still the one that entry describes: each entry records
the :func:`model_fingerprint` of its model (its weights and the decoding settings saved with it), and a model
whose fingerprint changed (retrained, edited, replaced) is evaluated again, with one warning that says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..utils import write_atomically
from .code_extraction import CODE_EXTRACTION_RULES

logger = logging.getLogger(__name__)

__all__ = ["GridResult", "model_fingerprint"]

RESULTS_FILE = "results.json"
# Files up to this size are hashed whole (configs, decoding defaults, tokenizers); larger ones (weights) by
# their size, modification time and first bytes (a safetensors header: names, dtypes, shapes, offsets).
_HASHED_WHOLE_BYTES = 16 * 1024 * 1024
_HEAD_BYTES = 1024 * 1024


@dataclass
class GridResult:
    """Everything :func:`~t3d_trl.evaluation.runner.run_grid` measured.

    Attributes:
        settings: how the grid was run (models, benchmarks, decoding settings, seeds, ...).
        results: one entry per (model, benchmark, setting): ``model``, ``benchmark``, ``setting`` (its fields
            and ``label``), ``generation_config``, ``metrics``, ``per_seed``, ``samples_file`` (JSON lines
            of the records, relative to the output folder; ``None`` without one), ``run_key`` and
            ``model_fingerprint`` (see the module docstring; ``None`` for a model given as an object).
    """

    settings: dict[str, Any]
    results: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings, "results": self.results}

    def metric(self, model: str, benchmark: str, setting: str, name: str = "accuracy") -> float:
        """One number of the grid, e.g. ``grid.metric("t3d", "GSM8K", "block4-tokps2")``."""
        for entry in self.results:
            if (entry["model"], entry["benchmark"], entry["setting"]["label"]) == (model, benchmark, setting):
                return entry["metrics"][name]
        raise KeyError(f"no result for model={model!r}, benchmark={benchmark!r}, setting={setting!r}")

    def record(self, entry: dict[str, Any]) -> None:
        """Add a run's entry; the same (model, benchmark, setting) run with other settings is replaced where it
        stood (the table keeps its order)."""
        same = [i for i, e in enumerate(self.results) if _entry_id(e) == _entry_id(entry)]
        if same:
            self.results[same[0]] = entry
        else:
            self.results.append(entry)
            self.results = _in_model_order(self.results, self.settings.get("models", {}))


def _in_model_order(results: list[dict[str, Any]], models: Iterable[str]) -> list[dict[str, Any]]:
    """``results`` grouped by model in the grid's order (its first model is the Gain column's baseline), each
    model's runs in the order they came."""
    rank = {name: i for i, name in enumerate(models)}
    return sorted(results, key=lambda entry: rank.get(entry["model"], len(rank)))


# ------------------------------------------------------------------------------------------------ files
def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def safe_name(name: str) -> str:
    """``name`` as one path component (``samples/<model>/<benchmark>/``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def _entry_id(entry: Mapping[str, Any]) -> tuple[str, str, str]:
    return entry["model"], entry["benchmark"], entry["setting"]["label"]


def read_results(output: Path) -> GridResult | None:
    """The ``results.json`` of an earlier run into ``output``; ``None`` when there is none."""
    path = output / RESULTS_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return GridResult(settings=data["settings"], results=list(data["results"]))
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(
            f"{path} is not a results file of t3d-trl eval ({err}); move it away or use another output_dir"
        ) from err


def check_output(
    output_dir: str | Path | None, models: Iterable[str]
) -> tuple[Path | None, GridResult | None]:
    """``output_dir`` as a path, and the results an earlier run left there; refused before any model loads when it
    cannot take this grid's results.

    Refused: a path that is a file (or lies under one), and two models (of ``models`` or of the earlier results)
    whose names :func:`safe_name` turns into the same ``samples/`` folder: the second would overwrite the first's
    samples while ``results.json`` pointed both at them.
    """
    if output_dir is None:
        return None, None
    output = Path(output_dir)
    existing = next((p for p in (output, *output.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        what = "is a file" if existing == output else f"is under {existing}, a file"
        raise NotADirectoryError(
            f"output_dir {output} {what}: results.json, table.md and samples/ need a folder"
        )
    earlier = read_results(output)
    models = list(models)
    names = [*models, *(e.get("model") for e in (earlier.results if earlier else []) if e.get("model"))]
    folders: dict[str, str] = {}
    for name in dict.fromkeys(names):
        other = folders.setdefault(safe_name(name).lower(), name)  # one folder on a case-blind disk too
        if other != name and other in models:  # earlier results alone are not rewritten
            also = "" if name in models else f" (its results are in {output / RESULTS_FILE})"
            raise ValueError(
                f"models {other!r} and {name!r}{also} would write their samples to the same folder "
                f"{output / 'samples' / safe_name(name)}: rename one"
            )
    return output, earlier


def write_results(output: Path, grid: GridResult) -> None:
    # A crash mid-write never leaves a truncated results.json.
    output.mkdir(parents=True, exist_ok=True)
    write_atomically(output / RESULTS_FILE, lambda tmp: tmp.write_text(json.dumps(grid.to_dict(), indent=2)))


def _merged_models(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """This grid's models, in its order, take the place of the first of them among the earlier ones (the others
    keep theirs): a model added in front of earlier ones becomes the Gain column's baseline, as ``--models``
    says, and a rerun of fewer models keeps the order it finds."""
    rest = [name for name in old if name not in new]
    first = next((i for i, name in enumerate(old) if name in new), len(old))
    place = sum(name not in new for name in list(old)[:first])
    return {name: new.get(name, old.get(name)) for name in [*rest[:place], *new, *rest[place:]]}


def merge_settings(earlier: GridResult, current: GridResult) -> GridResult:
    """Earlier results kept, the grid description the union of both (models, benchmarks, decoding)."""
    old, new = earlier.settings, current.settings
    merged = dict(new)
    merged["models"] = _merged_models(old.get("models", {}), new["models"])
    merged["benchmarks"] = list(dict.fromkeys([*old.get("benchmarks", []), *new["benchmarks"]]))
    labels = {d["label"] for d in new["decoding"]}
    merged["decoding"] = [d for d in old.get("decoding", []) if d["label"] not in labels] + new["decoding"]
    merged["data_files"] = {**old.get("data_files", {}), **new["data_files"]}
    return GridResult(settings=merged, results=_in_model_order(earlier.results, merged["models"]))


# ------------------------------------------------------------------------------------------------ fingerprints
def _model_folder(name_or_path: str) -> str | None:
    """The folder that holds a checkpoint: the path itself, or a Hub repo's snapshot in the local cache."""
    if os.path.isdir(name_or_path):
        return name_or_path
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name_or_path, "config.json")
        if not isinstance(cached, str):
            cached = try_to_load_from_cache(name_or_path, "adapter_config.json")
    except Exception:  # noqa: BLE001 - not a repo id, or no cache: no fingerprint (evaluated again)
        return None
    return os.path.dirname(cached) if isinstance(cached, str) else None


def _hash_file(digest: Any, path: str) -> None:
    stat = os.stat(path)  # follows the Hub cache's symlinks to their blobs
    with open(path, "rb") as f:
        if stat.st_size <= _HASHED_WHOLE_BYTES:
            digest.update(f.read())
        else:  # a retrained model keeps its header but never its modification time
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}:".encode())
            digest.update(f.read(_HEAD_BYTES))


def model_fingerprint(name_or_path: str) -> str | None:
    """A cheap digest that changes whenever a checkpoint's weights or saved settings change.

    Every file at the top of the checkpoint's folder counts (subfolders such as ``checkpoint-*`` do not): files
    up to 16 MiB (``config.json`` with its diffusion and decoding defaults, tokenizer files, small weights) by
    their bytes, larger ones (weights) by size, modification time and first MiB, so that fingerprinting an 8 GB
    model reads 1 MiB per file. A ``peft`` adapter's fingerprint includes its base model's. A Hub repo id is
    fingerprinted through its snapshot in the local cache. ``None`` when there is no local copy yet.
    """
    folder = _model_folder(name_or_path)
    if folder is None:
        return None
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            digest.update(name.encode() + b"\0")
            _hash_file(digest, path)
    from ..models.auto import adapter_base_model

    try:
        base = adapter_base_model(folder)
    except ValueError:
        base = None
    if base is not None:
        digest.update(f"base:{model_fingerprint(base)}".encode())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------ resume
def run_key(
    spec: Any,
    benchmark: str,
    setting: str,
    data_file: str | Path | None,
    settings: Mapping[str, Any],
    code_extraction: str | None = None,
) -> dict[str, Any] | None:
    """What identifies a finished run of a model given by path (``None`` for an object: never recognised).

    ``code_extraction``: the rule a code benchmark checked with; the default rule adds nothing to the key, so
    that results recorded before the rule was part of it still count."""
    if not isinstance(spec, str):
        return None
    key = {
        "model": spec,
        "benchmark": benchmark,
        "setting": setting,
        "data_file": str(data_file) if data_file is not None else None,
        **{k: settings[k] for k in ("generation_kwargs", "limit", "seeds", "num_samples")},
        **{k: settings[k] for k in ("use_chat_template", "dtype")},
    }
    if code_extraction not in (None, CODE_EXTRACTION_RULES[0]):
        key["code_extraction"] = code_extraction
    return key


def plan_runs(
    grid: GridResult,
    models: Mapping[str, Any],
    runs: Iterable[tuple[str, Any, Any, dict[str, Any] | None]],
    output: Path | None,
) -> dict[str, list[tuple[Any, Any]]]:
    """The ``(benchmark, setting)`` runs each model still needs, out of ``runs``: ``(model name, benchmark,
    setting, run key)``. A run is skipped when an earlier entry of the same model has its key and the model's
    fingerprint is unchanged; a model whose fingerprint changed is evaluated again (one warning per model)."""
    fingerprints = {name: model_fingerprint(spec) for name, spec in models.items() if isinstance(spec, str)}
    todo: dict[str, list[tuple[Any, Any]]] = {name: [] for name in models}
    skipped = 0
    changed: dict[str, int] = {}
    for name, benchmark, setting, key in runs:
        earlier = [
            e for e in grid.results if key is not None and e["model"] == name and e.get("run_key") == key
        ]
        fingerprint = fingerprints.get(name)
        if earlier and fingerprint is not None and earlier[-1].get("model_fingerprint") == fingerprint:
            skipped += 1
            continue
        if earlier:
            changed[name] = changed.get(name, 0) + 1
        todo[name].append((benchmark, setting))
    where = output / RESULTS_FILE if output is not None else RESULTS_FILE
    for name, count in changed.items():
        logger.warning(
            "model %r (%s) changed since its results in %s (weights or saved settings): evaluating its %d "
            "finished run(s) again",
            name,
            models[name],
            where,
            count,
        )
    if skipped:
        logger.info("skipping %d run(s) already finished in %s", skipped, where)
    return todo
