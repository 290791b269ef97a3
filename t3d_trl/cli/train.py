"""``t3d-trl train --config recipe.yaml``: distil a diffusion LM into a few-step student with T3D (or a baseline).

Recipe keys are the fields of :class:`TrainModelConfig` (TRL's ``ModelConfig``: ``model_name_or_path``,
``dtype``, ``use_peft`` and the ``lora_*`` options, plus ``trust_remote_code``), of :class:`TrainDataConfig`
(the dataset and ``accelerate_config``) and of :class:`~t3d_trl.T3DConfig` (the objective and every
``TrainingArguments`` setting); flags override the recipe. The run is the Python API's:
:class:`~t3d_trl.T3DTrainer` on :func:`~t3d_trl.load_trajectories`' data.

With ``--accelerate_config FILE`` the command starts itself again under ``accelerate launch --config_file FILE``
(several GPUs, DeepSpeed, FSDP); launching it under ``accelerate launch`` or ``torchrun`` yourself works too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl import ModelConfig

from .checks import check_accelerate_config, check_dataset_source
from .parsing import RecipeError, parse_recipe

_LAUNCHED = "T3D_TRL_LAUNCHED"  # set in the processes started by --accelerate_config (no second relaunch)


@dataclass
class TrainModelConfig(ModelConfig):
    """TRL's ``ModelConfig`` plus ``trust_remote_code``, which TRL's no longer has.

    Args:
        trust_remote_code: run the modeling and tokenizer code a checkpoint ships (its ``auto_map``); read it
            first.
    """

    trust_remote_code: bool = field(
        default=False, metadata={"help": "run the modeling code a checkpoint ships (auto_map); read it first"}
    )


@dataclass
class TrainDataConfig:
    """Data settings of ``t3d-trl train``.

    Args:
        dataset_name: a trajectory dataset (a folder written by ``t3d-trl collect`` or ``save_to_disk``, or a Hub
            repo). For ``loss_type: mdlm``: any dataset with ``prompt``/``completion`` or ``text`` columns (Hub
            id, local file or folder).
        dataset_split: the split to train on.
        eval_split: a split to evaluate on (same dataset).
        skip_invalid: drop trajectory rows that break the schema instead of failing.
        accelerate_config: an ``accelerate`` config file: relaunch this command with ``accelerate launch``.
    """

    dataset_name: str | None = field(
        default=None, metadata={"help": "trajectory dataset (folder or Hub repo)"}
    )
    dataset_split: str = "train"
    eval_split: str | None = None
    skip_invalid: bool = False
    accelerate_config: str | None = field(
        default=None, metadata={"help": "accelerate config file: run under `accelerate launch --config_file`"}
    )


def _load(data: TrainDataConfig, split: str, loss_type: str) -> Any:
    if loss_type == "mdlm":  # real data, not trajectories
        from .collect import load_source_dataset

        return load_source_dataset(data.dataset_name, split=split)
    from ..data.hub import load_trajectories

    return load_trajectories(data.dataset_name, split=split, skip_invalid=data.skip_invalid)


def _is_causal_lm(model: Any, name: str, hub_kwargs: dict[str, Any]) -> bool:
    """Whether peft's ``PeftModelForCausalLM`` fits ``model``: a decoder with ``prepare_inputs_for_generation``,
    not an encoder MLM (ModernBERT)."""
    from ..models.auto import read_model_kind

    return hasattr(model, "prepare_inputs_for_generation") and read_model_kind(name, **hub_kwargs)[1]


def run(model_args: TrainModelConfig, data: TrainDataConfig, args: Any) -> str:
    """Train as the recipe says; returns the output directory."""
    from trl import get_peft_config

    from ..models.auto import AutoModelForDiffusionLM, load_tokenizer
    from ..trainer import T3DTrainer
    from ..utils import resolve_dtype

    name = model_args.model_name_or_path
    # adapter_config.json names the base by this path: absolute, so the adapter loads from any directory.
    if os.path.isdir(name):
        name = os.path.abspath(name)
    dtype = resolve_dtype(model_args.dtype)
    hub_kwargs = {"revision": model_args.model_revision, "trust_remote_code": model_args.trust_remote_code}
    kwargs = {**hub_kwargs, "dtype": dtype}
    if model_args.attn_implementation is not None:
        kwargs["attn_implementation"] = model_args.attn_implementation
    tokenizer = load_tokenizer(name, **hub_kwargs)
    model = AutoModelForDiffusionLM.from_pretrained(name, **kwargs)
    peft_config = get_peft_config(model_args)
    if peft_config is not None:  # adapter_config.json records the base revision, which loading it reads
        peft_config.revision = model_args.model_revision
        # TRL's ModelConfig turns a one-item list into its item, which peft reads as a full-name regex.
        if isinstance(peft_config.target_modules, str) and peft_config.target_modules != "all-linear":
            peft_config.target_modules = [peft_config.target_modules]
        # TRL's default CAUSAL_LM wraps the model in PeftModelForCausalLM, which needs a generating decoder.
        if peft_config.task_type == "CAUSAL_LM" and not _is_causal_lm(model, name, hub_kwargs):
            peft_config.task_type = None
    trainer = T3DTrainer(
        model,
        args,
        train_dataset=_load(data, data.dataset_split, args.loss_type),
        eval_dataset=_load(data, data.eval_split, args.loss_type) if data.eval_split else None,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    trainer.save_model(args.output_dir)
    trainer.save_state()
    if args.push_to_hub:
        trainer.push_to_hub(dataset_name=data.dataset_name)
    return args.output_dir


def check_inputs(model_args: TrainModelConfig, data: TrainDataConfig, args: Any) -> None:
    """Everything that can be checked before anything loads (one line instead of a traceback after a load): the
    accelerate config and its backend, the model path or Hub id, the dataset and the loggers of ``report_to``."""
    from transformers.integrations import get_available_reporting_integrations

    quantized = [flag for flag in ("load_in_4bit", "load_in_8bit") if getattr(model_args, flag)]
    # TRL parses them, but nothing here loads a quantized model: it would train in full precision.
    if quantized:
        raise ValueError(
            f"--{quantized[0]}: not supported by t3d-trl train yet: it would train in full precision; drop it"
        )
    missing = sorted(set(args.report_to or []) - {"all", "none", *get_available_reporting_integrations()})
    if missing:
        raise ValueError(
            f"report_to {missing}: not installed (pip install {' '.join(missing)}), or report_to none"
        )
    if data.accelerate_config:
        check_accelerate_config(data.accelerate_config)
    from ..models.auto import check_model_source

    check_model_source(model_args.model_name_or_path, revision=model_args.model_revision)
    check_dataset_source(data.dataset_name)
    path = Path(data.dataset_name)
    if data.eval_split and (path.is_file() or (path / "state.json").is_file()):
        raise ValueError(
            f"eval_split {data.eval_split!r}: {data.dataset_name} is one dataset without splits, so its rows would "
            "be the training rows; evaluate on a dataset with that split"
        )


def _relaunch(config_file: str, argv: list[str]) -> int:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config_file]
    command += ["-m", "t3d_trl.cli.main", "train", *argv]
    return subprocess.call(command, env={**os.environ, _LAUNCHED: "1"})


def main(argv: list[str]) -> int:
    from ..trainer import T3DConfig

    model_args, data, args = parse_recipe(
        [TrainModelConfig, TrainDataConfig, T3DConfig], argv, prog="t3d-trl train", description=__doc__
    )
    missing = [
        n
        for n, v in (
            ("model_name_or_path", model_args.model_name_or_path),
            ("dataset_name", data.dataset_name),
        )
        if not v
    ]
    if missing:
        raise RecipeError(f"train needs {', '.join(missing)} (in the recipe or as flags)")
    check_inputs(model_args, data, args)
    # Already one of several processes (accelerate launch, torchrun, SLURM): run here, do not relaunch.
    launched = os.environ.get(_LAUNCHED) or int(os.environ.get("WORLD_SIZE", "1")) > 1
    if data.accelerate_config and not launched:
        from ..trainer.checkpoints import check_output_dir

        # Refused here in one line, not by every launched process with the launcher's traceback after it.
        check_output_dir(
            args.output_dir, args.resume_from_checkpoint, args.overwrite_output_dir, args.max_steps
        )
        return _relaunch(data.accelerate_config, argv)
    output_dir = run(model_args, data, args)
    if int(os.environ.get("RANK", "0")) == 0:  # one line, not one per process
        print(f"model saved to {output_dir}")
    return 0
