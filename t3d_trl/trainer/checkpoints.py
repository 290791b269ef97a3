"""The rules of a training ``output_dir``: what a run may resume from, what it refuses, what it deletes.

* A run resumes only from a checkpoint that loads: ``trainer_state.json`` present (the base trainer writes it
  last, so a save cut short by a kill has none), the weights present, the optimizer and scheduler states present
  (a finished model or a ``save_only_model`` checkpoint has none: resuming would restart both), every
  ``.safetensors`` file readable and every torch-saved file (optimizer, scheduler, RNG states) a whole zip
  archive (a crash or a partial copy leaves truncated ones). A damaged checkpoint is skipped with a warning.
* A resumed run must use the settings its checkpoint was trained with (``t3d_settings.json``): the objective,
  the training states and the optimisation. Changed ones are refused, naming each difference.
* A fresh run (no resume) into a folder that already holds checkpoints or a finished model is refused unless
  ``overwrite_output_dir``, which deletes them first: a later resume must not pick up an older run's
  checkpoints, and a finished model must not be replaced without being asked.
* A checkpoint whose save fails half-way is deleted, so that no resume picks it up.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers.trainer import (
    FSDP_MODEL_NAME,
    OPTIMIZER_NAME,
    OPTIMIZER_NAME_BIN,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import (
    CONFIG_NAME,
)

from ..models.auto import ADAPTER_CONFIG_FILE
from ..models.weights import ADAPTER_WEIGHTS_FILES, MODEL_WEIGHTS_FILES, check_weights, file_problem

logger = logging.getLogger(__name__)

CHECKPOINT_PATTERN = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-\d+")
#: The files of a finished model (``save_model``/``save_pretrained``): full weights, sharded weights, an adapter.
MODEL_FILES = (*MODEL_WEIGHTS_FILES, *ADAPTER_WEIGHTS_FILES, ADAPTER_CONFIG_FILE)
#: The run's settings a checkpoint records and a resume must match (:func:`run_settings`).
SETTINGS_FILE = "t3d_settings.json"
#: What a resumed run must keep: the objective, the training states (and the data they come from), and the
#: optimisation, whose state (the AdamW groups and the schedule) the checkpoint restores over any new value, and
#: whose global batch and seeds decide which batches the resume skips. Not max_steps/num_train_epochs, saving,
#: logging or evaluation: a run is extended or watched differently without changing what it trains.
RESUME_SETTINGS = (
    "loss_type",
    "beta",
    "fake_weight",
    "fake_estimator",
    "lambda_path",
    "path_weighting",
    "ref_sync_steps",
    "certainty_weight",
    "certainty_temperature",
    "block_length",
    "tokens_per_step",
    "state_sampling",
    "student_state_ratio",
    "student_state_labels",
    "random_token_prob",
    "max_prompt_length",
    "max_completion_length",
    "disable_dropout",
    "average_tokens_across_devices",
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "world_size",
    "seed",
    "data_seed",
)
#: JSON files a resume reads (besides a weights index, checked with its shards).
RESUME_JSON_FILES = (TRAINER_STATE_NAME, SETTINGS_FILE, CONFIG_NAME)
#: Files written with ``torch.save`` (zip archives) that a resume loads: optimizer, scheduler, scaler, RNG
#: states, ``.bin`` weights, DeepSpeed's states. ``training_args.bin`` is never loaded.
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


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


def _weights_problem(folder: Path, subfolders: list[Path], deepspeed: bool) -> str | None:
    """Why ``folder`` holds no weights to resume with, as transformers looks for them; ``None`` when it does
    (``deepspeed``: DeepSpeed's own ``global_step*`` folder holds them)."""
    fsdp = (folder / f"{FSDP_MODEL_NAME}.bin").is_file() or any(FSDP_MODEL_NAME in p.name for p in subfolders)
    adapters = any(  # several adapters: one subfolder each
        (p / name).is_file() for p in subfolders for name in ADAPTER_WEIGHTS_FILES
    )
    if deepspeed or fsdp or adapters:
        return None
    try:  # a model's or an adapter's own files, as from_pretrained finds them (a sharded index and its shards)
        check_weights(str(folder), adapter=(folder / ADAPTER_CONFIG_FILE).is_file())
    except (FileNotFoundError, ValueError) as err:
        return str(err)
    return None


def _optimizer_problem(folder: Path, subfolders: list[Path], deepspeed: bool) -> str | None:
    """Why ``folder`` holds no optimizer or scheduler state to resume with; ``None`` when it does.

    transformers loads neither unless both are there (``Trainer._load_optimizer_and_scheduler``), and would then
    restart the optimizer and the learning-rate schedule without a word.
    """
    if deepspeed:
        return None  # DeepSpeed's own folder holds both (and scheduler.pt, for a scheduler of ours)
    # optimizer.pt, or FSDP's optimizer.bin (full state) or optimizer_0/ (sharded), as transformers finds them.
    optimizer = any((folder / name).is_file() for name in (OPTIMIZER_NAME, OPTIMIZER_NAME_BIN)) or any(
        OPTIMIZER_NAME_BIN.split(".")[0] in p.name for p in subfolders
    )
    scheduler = (folder / SCHEDULER_NAME).is_file()
    missing = [name for name, held in ((OPTIMIZER_NAME, optimizer), (SCHEDULER_NAME, scheduler)) if not held]
    if missing:
        return (
            f"{folder} holds no optimizer or learning-rate scheduler state (no {' or '.join(missing)}): a finished "
            "model or a save_only_model checkpoint (or an incomplete copy of a checkpoint), from which a resumed "
            "run would restart its optimizer and schedule; start a new run from it instead (model_name_or_path)"
        )
    return None


def checkpoint_problem(checkpoint: str | os.PathLike) -> str | None:
    """Why ``checkpoint`` cannot be resumed from, or ``None`` when it loads.

    Checks that the weights and the optimizer and scheduler states are there, and reads the header of every file
    a resume loads (``.safetensors``, torch-saved zips, JSON), so a truncated one is found before the trainer
    tries to load it.
    """
    folder = Path(checkpoint)
    if not folder.is_dir():
        return f"{folder}: no such checkpoint folder"
    if not (folder / TRAINER_STATE_NAME).is_file():
        return f"{folder} has no {TRAINER_STATE_NAME} (interrupted while saved?)"
    subfolders = [p for p in folder.iterdir() if p.is_dir()]
    deepspeed = any(p.name.startswith("global_step") for p in subfolders)
    problem = _weights_problem(folder, subfolders, deepspeed) or _optimizer_problem(
        folder, subfolders, deepspeed
    )
    if problem is not None:
        return problem
    loaded = [folder / name for name in RESUME_JSON_FILES if (folder / name).is_file()]
    loaded += [
        path
        for path in sorted(folder.rglob("*"))
        if path.suffix in (".safetensors", *TORCH_SUFFIXES)
        and path.name != "training_args.bin"
        and path.is_file()
    ]
    return next((problem for path in loaded if (problem := file_problem(path)) is not None), None)


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


def run_settings(args: Any, block_length: int) -> dict[str, Any]:
    """The settings of ``RESUME_SETTINGS`` a run trains with, as JSON values (``block_length``: the one in use)."""
    values = args.to_dict()  # enums (the scheduler type) as their values
    settings = {name: values[name] for name in RESUME_SETTINGS if name in values}
    settings.update(block_length=block_length, world_size=args.world_size)
    if args.auto_find_batch_size:  # transformers lowers the batch itself, and restores the checkpoint's
        settings.pop("per_device_train_batch_size")
    if args.world_size == 1:  # it only decides how processes share a step's token count
        settings.pop("average_tokens_across_devices", None)
    if "lr_scheduler_kwargs" in settings:  # None and {} are the same schedule
        settings["lr_scheduler_kwargs"] = settings["lr_scheduler_kwargs"] or {}
    return json.loads(json.dumps(settings))


def save_settings(folder: str | os.PathLike, settings: dict[str, Any]) -> None:
    """Record ``settings`` (:func:`run_settings`) in checkpoint ``folder``, for :func:`check_settings`."""
    Path(folder, SETTINGS_FILE).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def check_settings(checkpoint: str | os.PathLike, settings: dict[str, Any]) -> None:
    """Refuse to resume from ``checkpoint`` with other ``settings`` than it was trained with, naming each
    difference: the resumed steps would train another objective, or at a learning rate the restored optimizer and
    scheduler silently override, or skip the wrong batches. A checkpoint from before the settings were recorded
    (no ``t3d_settings.json``) resumes as it is; a setting it does not record is not compared."""
    path = Path(checkpoint, SETTINGS_FILE)
    if not path.is_file():
        return
    saved = json.loads(path.read_text())
    diffs = [
        f"{name}: checkpoint {saved[name]!r}, now {value!r}"
        for name, value in settings.items()
        if name in saved and saved[name] != value
    ]
    if diffs:
        raise ValueError(
            f"{checkpoint} was trained with other settings than this run's ({'; '.join(diffs)}): resume with the "
            "checkpoint's settings, or start another run in a new output_dir (from this checkpoint's weights: "
            "model_name_or_path)"
        )


def check_steps_left(checkpoint: str | os.PathLike, max_steps: int) -> None:
    """Refuse to resume from ``checkpoint`` when it has already reached ``max_steps`` (``-1``: epochs decide):
    transformers would train one step past it and replace the finished model."""
    step = json.loads(Path(checkpoint, TRAINER_STATE_NAME).read_text()).get("global_step", 0)
    if 0 < max_steps <= step:
        raise ValueError(
            f"{checkpoint} is at step {step} and max_steps is {max_steps}: the run is finished; to train on from "
            "it, raise max_steps"
        )


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


def check_output_dir(
    output_dir: str | os.PathLike,
    resume_from_checkpoint: str | bool | None,
    overwrite: bool,
    max_steps: int,
    settings: dict[str, Any] | None = None,
) -> str | None:
    """What a run into ``output_dir`` would refuse, checked without changing it: a fresh run over checkpoints or a
    finished model without ``overwrite``, a resume with other ``settings`` than its checkpoint's (when given: the
    command line checks before ``accelerate launch`` without them), or from a checkpoint already at ``max_steps``.
    Returns the checkpoint the run resumes from (``None``: a fresh run)."""
    checkpoint = resume_checkpoint(output_dir, resume_from_checkpoint)
    if checkpoint is None:
        if not overwrite:
            clear_for_fresh_run(output_dir, overwrite=False, is_main=False)  # refuses, deletes nothing
        return None
    if settings is not None:
        check_settings(checkpoint, settings)
    check_steps_left(checkpoint, max_steps)
    return checkpoint


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
