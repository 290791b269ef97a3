"""The rules of a training ``output_dir``: what a run may resume from, what it refuses, what it deletes.

* A run resumes only from a checkpoint that loads: ``trainer_state.json`` present (the base trainer writes it
  last, so a save cut short by a kill has none), the optimizer and scheduler states present (a finished model or
  a ``save_only_model`` checkpoint has none: resuming would restart both) and every ``.safetensors`` file readable
  (a crash or a partial copy leaves truncated ones). A damaged checkpoint is skipped with a warning naming it.
* A fresh run (no resume) into a folder that already holds checkpoints or a finished model is refused unless
  ``overwrite_output_dir``, which deletes them first: a later resume must not pick up an older run's
  checkpoints, and a finished model must not be replaced without being asked.
* A checkpoint whose save fails half-way is deleted, so that no resume picks it up.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from transformers.trainer import SCHEDULER_NAME, TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)

CHECKPOINT_PATTERN = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-\d+")
#: The files of a finished model (``save_model``/``save_pretrained``): full weights, sharded weights, an adapter.
MODEL_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
    "adapter_config.json",
)


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The ``checkpoint-<step>`` folders of ``output_dir``, by step."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and CHECKPOINT_PATTERN.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(p.name.rsplit("-", 1)[1]))


def finished_model_files(output_dir: str | os.PathLike) -> list[Path]:
    """The files of a finished model saved directly in ``output_dir`` (weights, sharded weights, an adapter)."""
    folder = Path(output_dir)
    named = [folder / name for name in MODEL_FILES]
    shards = sorted(folder.glob("model-*-of-*.safetensors")) if folder.is_dir() else []
    return [p for p in named if p.is_file()] + shards


def checkpoint_problem(checkpoint: str | os.PathLike) -> str | None:
    """Why ``checkpoint`` cannot be resumed from, or ``None`` when it loads.

    Reads every ``.safetensors`` header (a few bytes each; safetensors also checks that the file holds all the
    data its header describes), so a truncated weights file is found before the trainer tries to load it.
    """
    import safetensors

    folder = Path(checkpoint)
    if not folder.is_dir():
        return f"{folder}: no such checkpoint folder"
    if not (folder / TRAINER_STATE_NAME).is_file():
        return f"{folder} has no {TRAINER_STATE_NAME} (interrupted while saved?)"
    # The scheduler's state is saved beside the optimizer's on every path but DeepSpeed's own scheduler, whose
    # state is in DeepSpeed's global_step* folder. Without them the base trainer would restart both silently.
    if not (folder / SCHEDULER_NAME).is_file() and not any(folder.glob("global_step*")):
        return (
            f"{folder} holds no optimizer or learning-rate scheduler state ({SCHEDULER_NAME}): it is a finished "
            "model or a save_only_model checkpoint, from which a resumed run would restart its optimizer and "
            "schedule; start a new run from it instead (model_name_or_path)"
        )
    for path in sorted(folder.rglob("*.safetensors")):
        try:
            with safetensors.safe_open(str(path), framework="pt"):
                pass
        except Exception as err:  # safetensors raises its own error type (and OSError) for damaged files
            return f"{path} is damaged ({' '.join(str(err).split())})"
    return None


def last_loadable_checkpoint(output_dir: str | os.PathLike) -> str:
    """The last checkpoint of ``output_dir`` that loads; damaged or incomplete ones are skipped with a warning.

    Raises ``ValueError`` (one line) when there is none.
    """
    checkpoints = list_checkpoints(output_dir)
    problems = []
    for path in reversed(checkpoints):
        problem = checkpoint_problem(path)
        if problem is None:
            return str(path)
        logger.warning("not resuming from %s: %s", path.name, problem)
        problems.append(problem)
    if not checkpoints:
        raise ValueError(f"resume_from_checkpoint=True but {output_dir} holds no checkpoint-* folder")
    raise ValueError(
        f"resume_from_checkpoint=True but no checkpoint in {output_dir} loads: {'; '.join(problems)}"
    )


def resume_checkpoint(
    output_dir: str | os.PathLike, resume_from_checkpoint: str | bool | None
) -> str | bool | None:
    """The checkpoint a run resumes from (``None``: a fresh run).

    ``resume_from_checkpoint`` is a checkpoint folder, ``True`` for the last one of ``output_dir`` that loads, or
    the strings ``"true"``/``"false"`` a command line gives. A folder named explicitly must load too.
    """
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() in ("true", "false"):
        resume_from_checkpoint = resume_from_checkpoint.lower() == "true" or None
    if resume_from_checkpoint is True:
        return last_loadable_checkpoint(output_dir)
    if resume_from_checkpoint:
        problem = checkpoint_problem(resume_from_checkpoint)
        if problem is not None:
            raise ValueError(f"cannot resume from {resume_from_checkpoint}: {problem}")
        return str(resume_from_checkpoint)
    return None


def clear_for_fresh_run(output_dir: str | os.PathLike, overwrite: bool, is_main: bool) -> None:
    """Refuse a fresh run into a folder with checkpoints or a finished model, or, with ``overwrite``, delete
    them (on the main process)."""
    checkpoints = list_checkpoints(output_dir)
    model_files = finished_model_files(output_dir)
    if not (checkpoints or model_files):
        return
    held = [p.name for p in checkpoints]
    if model_files:
        held.append(f"a finished model ({', '.join(p.name for p in model_files)})")
    if not overwrite:
        resume = (
            "pass resume_from_checkpoint=True (--resume_from_checkpoint true) to continue from the last one, or "
            if checkpoints
            else ""
        )
        raise ValueError(
            f"{output_dir} already holds {', '.join(held)}: {resume}overwrite_output_dir=True "
            "(--overwrite_output_dir true) to delete them and start over"
            + ("" if checkpoints else ", or choose another output_dir")
        )
    if is_main:
        logger.warning(
            "overwrite_output_dir: deleting %s", ", ".join(str(p) for p in checkpoints + model_files)
        )
        for path in checkpoints:
            shutil.rmtree(path)
        for path in model_files:
            path.unlink()


@contextmanager
def removed_on_failure(folder: str | os.PathLike, is_main: bool) -> Iterator[None]:
    """Delete ``folder`` if the block fails (Ctrl-C included) and the folder did not exist before it: no
    half-written ``checkpoint-N/`` is left behind for a resume to pick up."""
    existed = os.path.isdir(folder)
    try:
        yield
    except BaseException:
        if not existed and is_main:
            shutil.rmtree(folder, ignore_errors=True)
        raise
