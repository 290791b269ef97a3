"""``T3DTrainer``: trajectory self-distillation of a masked diffusion LM into a few-step student (TRL trainer)."""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import re
import shutil
import textwrap
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow.compute as pc
import safetensors.torch
import torch
from accelerate.utils import is_peft_model
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.models.utils import disable_gradient_checkpointing, prepare_deepspeed, prepare_fsdp
from trl.trainer.base_trainer import _BaseTrainer
from trl.trainer.utils import disable_dropout_in_model, get_config_model_id, use_adapter

from ..data.collator import DataCollatorForDiffusion, diffusion_attention_mask
from ..data.schema import TrajectoryMetadata
from ..diffusion.config import require_diffusion_config
from ..diffusion.forward import accepts_4d_mask, diffusion_forward, unwrap_model
from ..generation.configuration import DiffusionGenerationConfig
from ..models.auto import AutoModelForDiffusionLM, save_adapter_defaults
from ..utils import check_process_count
from . import losses
from .config import REFERENCE_LOSSES, TRAJECTORY_LOSSES, T3DConfig

logger = logging.getLogger(__name__)

REFERENCE_FILE = "t3d_reference.safetensors"
_REF_ADAPTER = "ref"
_COLUMNS = ("prompt_ids", "completion_ids", "decode_step", "row_index")
_MODEL_CARD_TEMPLATE = Path(__file__).with_name("model_card.jinja")
_CHECKPOINT = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-\d+")


def _is_sharded(module: torch.nn.Module) -> bool:
    """Whether FSDP2 has sharded ``module``'s parameters (they are ``DTensor``s)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def _full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on the CPU, gathered from its shards if FSDP2 sharded it (a collective call)."""
    from torch.distributed.tensor import DTensor

    tensor = tensor.detach()
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).cpu()


def _reshard(*modules: torch.nn.Module) -> None:
    """Shard FSDP2 weights that are still gathered: after a forward without backward (the reference's), FSDP2
    keeps the root module's weights whole, and they would not pair with the other model's shards."""
    from torch.distributed.fsdp import FSDPModule

    for module in modules:
        for sub in module.modules():
            if isinstance(sub, FSDPModule):
                sub.reshard()


@torch.no_grad()
def _copy_into(target: torch.Tensor, value: torch.Tensor) -> None:
    """``target <- value`` for a whole ``value``; a sharded ``target`` takes its own shard (no communication)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        value = distribute_tensor(value, target.device_mesh, target.placements, src_data_rank=None)
    target.data.copy_(value)


@torch.no_grad()
def _copy_parameters(
    sources: list[torch.nn.Parameter], targets: list[torch.nn.Parameter], zero3: bool = False
) -> None:
    """``targets <- sources``; ZeRO-3 parameters are sharded, so they are gathered first."""
    if zero3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(sources + targets, modifier_rank=0):
            if deepspeed.comm.get_rank() == 0:
                for target, source in zip(targets, sources, strict=True):
                    target.data.copy_(source.data)
        return
    for target, source in zip(targets, sources, strict=True):
        target.data.copy_(source.data)


def _checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The ``checkpoint-<step>`` folders of ``output_dir``, by step."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and _CHECKPOINT.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(p.name.rsplit("-", 1)[1]))


def _last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The last checkpoint with its ``trainer_state.json`` (written last): one cut short by a kill is skipped."""
    for path in reversed(_checkpoints(output_dir)):
        if (path / TRAINER_STATE_NAME).is_file():
            return str(path)
        logger.warning("%s has no %s (interrupted while saved?): not resumed from", path, TRAINER_STATE_NAME)
    return None


class _T3DCallback(TrainerCallback):
    """Refreshes the reference model every ``ref_sync_steps`` optimizer steps and gives the collator its epoch."""

    def __init__(self, trainer: T3DTrainer):
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        collator = self.trainer.data_collator
        if isinstance(collator, DataCollatorForDiffusion):
            collator.epoch = math.floor(state.epoch + 1e-6)

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer._needs_reference and state.global_step % args.ref_sync_steps == 0:
            self.trainer.sync_reference()


class T3DTrainer(_BaseTrainer):
    """Trainer for T3D (trajectory self-distillation with DDO) and its baselines.

    Args:
        model: the student, initialised from the teacher: a model loaded with
            :class:`~t3d_trl.AutoModelForDiffusionLM` (or given a diffusion description with
            :func:`~t3d_trl.add_diffusion_generation`), a ``peft`` ``PeftModel`` of one, or a name/path to load.
        args: a :class:`T3DConfig`.
        train_dataset: trajectories (:func:`~t3d_trl.load_trajectories`: columns ``prompt_ids``,
            ``completion_ids``, ``decode_step``; metadata attached), or for ``mdlm`` rows with ``prompt_ids`` and
            ``completion_ids``, ``prompt`` and ``completion`` strings, or a ``text`` column.
        eval_dataset: same format, evaluated with the training loss.
        processing_class: the tokenizer (saved with the model; needed to tokenise text for ``mdlm``).
        data_collator: defaults to :class:`~t3d_trl.data.collator.DataCollatorForDiffusion`.
        callbacks, optimizers: as for :class:`transformers.Trainer`.
        peft_config: a ``peft`` config to wrap ``model`` with (e.g. ``LoraConfig``).

    One optimizer step of ``t3d``/``ddo`` costs one student forward/backward and one reference forward: the
    real, fake and path terms read the same logits. The reference model is a frozen copy of the student
    refreshed every ``ref_sync_steps`` optimizer steps; with PEFT it is a second adapter (``"ref"``) on the same
    base weights. Checkpoints store it (``t3d_reference.safetensors``), so resuming restores it exactly.
    """

    _tag_names = ["trl", "t3d", "t3d-trl", "diffusion-language-model"]
    _name = "T3D"
    _paper = {
        "title": "Few-Step Diffusion Language Models via Trajectory Self-Distillation",
        "id": None,
        "citation": textwrap.dedent("""\
            @misc{zhang2026t3d,
                title   = {{Few-Step Diffusion Language Models via Trajectory Self-Distillation}},
                author  = {Tunyu Zhang and Xinxi Zhang and Ligong Han and Haizhou Shi and Xiaoxiao He and Zhuowei Li and Hao Wang and Kai Xu and Akash Srivastava and Chengzhi Mao and Hao Wang and Vladimir Pavlovic and Dimitris N. Metaxas},
                year    = 2026,
                note    = {Preprint},
            }"""),
    }
    # compute_loss normalises by the item count of the whole accumulated step (see _get_num_items_in_batch).
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        model: str | torch.nn.Module,
        args: T3DConfig | None = None,
        train_dataset: datasets.Dataset | None = None,
        eval_dataset: datasets.Dataset | dict[str, datasets.Dataset] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        data_collator: Any = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        peft_config: Any = None,
    ):
        if args is None:
            name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = T3DConfig(f"{str(name).split('/')[-1]}-T3D")
        if not isinstance(args, T3DConfig):
            raise TypeError(f"args must be a T3DConfig, got {type(args).__name__}")
        if train_dataset is None:
            raise ValueError("train_dataset is required")
        if isinstance(model, str):
            if processing_class is None:
                from transformers import AutoTokenizer

                processing_class = AutoTokenizer.from_pretrained(model)
            model = AutoModelForDiffusionLM.from_pretrained(model, dtype="auto")

        # The model: a diffusion description is what makes it a masked diffusion LM.
        inner = unwrap_model(model)
        diffusion = require_diffusion_config(inner)
        head = inner.get_output_embeddings()
        vocab = (head if head is not None else inner.get_input_embeddings()).weight.shape[0]
        if diffusion.mask_token_id >= vocab:
            raise ValueError(
                f"mask_token_id={diffusion.mask_token_id} is outside the model's vocabulary of {vocab}"
            )
        if diffusion.is_block_causal and not accepts_4d_mask(inner):
            raise ValueError(
                f"block-causal training needs a decoder taking 4D masks; {type(inner).__name__} is not"
            )
        if diffusion.is_block_causal and diffusion.shift_logits:
            raise ValueError("block-causal training of a model with shifted logits is not supported")
        self.diffusion = diffusion
        self._vocab_size = vocab
        self._max_positions = getattr(inner.config, "max_position_embeddings", None)

        # PEFT: the reference is a second adapter on the same base weights.
        if peft_config is not None:
            if is_peft_model(model):
                raise ValueError("pass either a PeftModel or a peft_config, not both")
            from peft import get_peft_model

            model = get_peft_model(model, peft_config)
        self._needs_reference = args.loss_type in REFERENCE_LOSSES
        self._ref_adapter = self._needs_reference and is_peft_model(model)
        if self._ref_adapter:
            if len(model.peft_config) != 1:
                raise ValueError(f"expected one trained adapter, found {sorted(model.peft_config)}")
            self._trained_adapter = model.active_adapter
            model.add_adapter(_REF_ADAPTER, model.peft_config[self._trained_adapter])
            model.set_adapter(self._trained_adapter)
        if is_peft_model(model) and args.gradient_checkpointing:
            model.enable_input_require_grads()
        if args.disable_dropout:
            disable_dropout_in_model(model)

        # Data.
        metadata = TrajectoryMetadata.from_dataset(train_dataset) if hasattr(train_dataset, "info") else None
        self.trajectory_metadata = metadata
        self.block_length = self._resolve_block_length(args, metadata)
        if args.loss_type != "mdlm" and self.block_length % args.tokens_per_step:
            raise ValueError(
                f"block_length={self.block_length} is not a multiple of tokens_per_step={args.tokens_per_step}"
            )
        self._check_metadata(metadata)
        # The main process prepares first; the others then reuse the cache of mdlm's tokenisation.
        with args.main_process_first(desc="dataset preparation"):
            train_dataset = self._prepare_dataset(train_dataset, args, processing_class, "train")
            if isinstance(eval_dataset, dict):
                eval_dataset = {
                    k: self._prepare_dataset(v, args, processing_class, k) for k, v in eval_dataset.items()
                }
            elif eval_dataset is not None:
                eval_dataset = self._prepare_dataset(eval_dataset, args, processing_class, "eval")
        if data_collator is None:
            pad_id = getattr(processing_class, "pad_token_id", None)
            pad_id = inner.config.pad_token_id if pad_id is None else pad_id
            data_collator = DataCollatorForDiffusion(
                diffusion=diffusion,
                block_length=self.block_length,
                pad_token_id=int(pad_id if pad_id is not None else 0),
                states={"redi": "random", "mdlm": "random", "dparallel": "semi_ar"}.get(
                    args.loss_type, "trajectory"
                ),
                state_sampling=args.state_sampling,
                random_token_prob=args.random_token_prob,
                vocab_size=min(len(processing_class), vocab) if processing_class is not None else vocab,
                tokens_per_step=args.tokens_per_step,
                seed=args.seed,
            )

        # The distilled model samples with the few-step budget it was trained for.
        if args.loss_type != "mdlm":
            self._set_generation_defaults(inner, args, metadata)

        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        if args.n_gpu > 1:
            raise ValueError(
                "T3DTrainer does not support nn.DataParallel: launch with `accelerate launch` or `torchrun`, or make "
                "one GPU visible"
            )
        self._check_launch()

        self.ref_model = None
        if self._needs_reference and not self._ref_adapter:
            self.ref_model = self._build_reference()
        # The frozen teacher that labels student states: the initial student (self-distillation), never refreshed.
        self.teacher_model = None
        if args.student_state_ratio > 0:
            if is_peft_model(self.model):
                raise ValueError("student_state_ratio > 0 is not supported with PEFT adapters yet")
            self.teacher_model = self._build_reference()
            student = list(self.accelerator.unwrap_model(self.model).parameters())
            teacher = list(self.accelerator.unwrap_model(self.teacher_model).parameters())
            _copy_parameters(student, teacher, zero3=self._zero3)
        self._ref_synced_at: int | None = None
        if self._needs_reference:
            self.sync_reference()  # round 0: the reference is the initial student (a resume loads its own)
        self.add_callback(_T3DCallback(self))
        self._metrics: dict[str, dict[str, list[float]]] = {
            "train": defaultdict(list),
            "eval": defaultdict(list),
        }
        if hasattr(self.model, "add_model_tags"):
            self.model.add_model_tags(self._tag_names)

    # ---- setup ----------------------------------------------------------------------------------------------

    def _check_launch(self) -> None:
        """Stop a multi-process launch that would not train one model together (it would train N copies)."""
        check_process_count(
            self.args.world_size,
            "training",
            f"each process would train its own copy of the model and all would save to {self.args.output_dir}",
        )
        # accelerate turns a launch into FSDP or DeepSpeed only on GPUs (and other accelerators): on CPU
        # processes (use_cpu) it sets up plain data parallel, each process holding the whole model.
        for name, enabled in (("FSDP", self.is_fsdp_enabled), ("DeepSpeed", self.is_deepspeed_enabled)):
            if os.environ.get(f"ACCELERATE_USE_{name.upper()}", "").lower() == "true" and not enabled:
                raise ValueError(
                    f"the launcher asked for {name} but accelerate set up "
                    f"{self.accelerator.distributed_type.value}: accelerate shards with {name} on GPUs only, on "
                    "CPU processes every process would hold the whole model. Use a MULTI_GPU config (plain data "
                    "parallel) on CPUs; sharding on CPU processes is shown with torch FSDP2 directly in "
                    "benchmarks/bench_distributed.py (docs/recipes.md#several-cpu-processes)"
                )

    def _resolve_block_length(self, args: T3DConfig, metadata: TrajectoryMetadata | None) -> int:
        if (
            metadata is not None
            and args.block_length not in (None, metadata.block_length)
            and args.loss_type in TRAJECTORY_LOSSES
        ):
            raise ValueError(
                f"block_length={args.block_length} differs from the trajectories' block_length="
                f"{metadata.block_length}: trajectory states exist only for the teacher's blocks"
            )
        if metadata is not None and metadata.attention != self.diffusion.attention:
            raise ValueError(
                f"the trajectories were decoded with {metadata.attention} attention but the student is "
                f"{self.diffusion.attention}: block alignment would not match"
            )
        block = (
            args.block_length or (metadata.block_length if metadata else None) or self.diffusion.block_size
        )
        return int(block or 4)

    def _check_metadata(self, metadata: TrajectoryMetadata | None) -> None:
        if metadata is None:
            return
        if metadata.vocab_size is not None and metadata.vocab_size != self._vocab_size:
            raise ValueError(
                f"the trajectories come from a model with a vocabulary of {metadata.vocab_size} (teacher "
                f"{metadata.teacher!r}) but the student has {self._vocab_size}: they were made with another tokenizer"
            )
        if metadata.mask_token_id != self.diffusion.mask_token_id:
            raise ValueError(
                f"the trajectories use mask token id {metadata.mask_token_id} but the student uses "
                f"{self.diffusion.mask_token_id}: they were made with another tokenizer"
            )

    def _prepare_dataset(
        self, dataset: datasets.Dataset, args: T3DConfig, tokenizer: Any, name: str
    ) -> datasets.Dataset:
        if not isinstance(dataset, datasets.Dataset):
            raise TypeError(f"{name} dataset must be a datasets.Dataset, got {type(dataset).__name__}")
        columns = set(dataset.column_names)
        if args.loss_type == "mdlm" and not {"prompt_ids", "completion_ids"} <= columns:
            dataset = self._tokenize(dataset, tokenizer, args, name)
            columns = set(dataset.column_names)
        needed = ["prompt_ids", "completion_ids"] + (
            ["decode_step"] if args.loss_type in TRAJECTORY_LOSSES else []
        )
        missing = [c for c in needed if c not in columns]
        if missing:
            hint = (
                " (the teacher's decoding order: collect trajectories with t3d_trl.collect_trajectories)"
                if "decode_step" in missing
                else ""
            )
            raise ValueError(
                f"loss_type={args.loss_type!r} needs column(s) {missing}{hint}; the {name} dataset has "
                f"{sorted(columns)}"
            )
        table = dataset.select_columns(needed).with_format("arrow")[:]
        lengths = pc.list_value_length(table["completion_ids"])
        if "decode_step" in needed:
            bad = pc.not_equal(lengths, pc.list_value_length(table["decode_step"]))
            self._refuse_rows(
                dataset, bad, f"{name} dataset", "completion_ids and decode_step differ in length"
            )
            steps = pc.list_flatten(table["decode_step"])
            if len(steps) and pc.min(steps).as_py() < 1:
                raise ValueError(
                    f"{name} dataset: decode_step holds values below 1 (steps are global and 1-based)"
                )
        for column in ("prompt_ids", "completion_ids"):
            ids = pc.list_flatten(table[column])
            bad = pc.or_(pc.less(ids, 0), pc.greater_equal(ids, self._vocab_size))
            if len(ids) and pc.any(bad).as_py():
                first = pc.index(bad, True).as_py()
                row_ends = np.cumsum(pc.list_value_length(table[column]).to_numpy(zero_copy_only=False))
                index = int(np.searchsorted(row_ends, first, side="right"))
                row_id = dataset[index]["id"] if "id" in dataset.column_names else index
                raise ValueError(
                    f"{name} dataset row {index} (id={row_id!r}): {column} holds token id {ids[first].as_py()}, "
                    f"outside the model's vocabulary of {self._vocab_size}: the data was tokenised with another "
                    "tokenizer"
                )
        # Rows over the limits: prompts are never truncated (the row is dropped); completions are cut. A row
        # longer than the model's positions after the cut is dropped too: its positions would have no embedding.
        limit = args.max_completion_length
        prompt_lengths = pc.list_value_length(table["prompt_ids"]).to_numpy(zero_copy_only=False)
        completion_lengths = lengths.to_numpy(zero_copy_only=False)
        if limit is not None:
            completion_lengths = np.minimum(completion_lengths, limit)
        rules = {"empty completion": completion_lengths == 0}
        if args.max_prompt_length is not None:
            rules[f"prompt longer than max_prompt_length={args.max_prompt_length}"] = (
                prompt_lengths > args.max_prompt_length
            )
        if self._max_positions is not None:
            rules[
                f"prompt + completion (cut to max_completion_length={limit}) longer than the model's "
                f"max_position_embeddings={self._max_positions}"
            ] = prompt_lengths + completion_lengths > self._max_positions
        drop = np.zeros(len(dataset), dtype=bool)
        counts = []
        for rule, hit in rules.items():
            if (hit & ~drop).any():  # each row is counted under the first rule that drops it
                counts.append(f"{int((hit & ~drop).sum())} {rule}")
            drop |= hit
        if drop.any():
            logger.warning(
                "%s dataset: dropped %d of %d rows (%s)", name, int(drop.sum()), len(drop), "; ".join(counts)
            )
            # In memory: no cache file is written into the folder the data was loaded from.
            dataset = dataset.select(np.flatnonzero(~drop), keep_in_memory=True)
        if len(dataset) == 0:
            raise ValueError(f"{name} dataset has no usable rows")
        extra = [c for c in dataset.column_names if c not in needed]
        dataset = dataset.remove_columns(extra)

        def finish(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
            if limit is not None:
                for column in needed[1:]:
                    batch[column] = [values[:limit] for values in batch[column]]
            batch["row_index"] = indices
            return batch

        return dataset.map(
            finish, batched=True, with_indices=True, num_proc=args.dataset_num_proc, keep_in_memory=True
        )

    @staticmethod
    def _refuse_rows(dataset: datasets.Dataset, bad: Any, where: str, problem: str) -> None:
        bad = np.asarray(bad.to_numpy(zero_copy_only=False), dtype=bool)
        if bad.any():
            index = int(np.flatnonzero(bad)[0])
            row_id = dataset[index]["id"] if "id" in dataset.column_names else index
            raise ValueError(f"{where} row {index} (id={row_id!r}): {problem} ({int(bad.sum())} such rows)")

    def _tokenize(
        self, dataset: datasets.Dataset, tokenizer: Any, args: T3DConfig, name: str
    ) -> datasets.Dataset:
        columns = set(dataset.column_names)
        if tokenizer is None:
            raise ValueError(
                f"loss_type='mdlm' on text needs processing_class (a tokenizer) to tokenise {name}"
            )
        eos = tokenizer.eos_token_id
        if {"prompt", "completion"} <= columns:

            def tokenize(row: dict[str, Any]) -> dict[str, Any]:
                completion = tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
                if eos is not None and (not completion or completion[-1] != eos):
                    completion = completion + [eos]
                return {
                    "prompt_ids": tokenizer(row["prompt"], add_special_tokens=False)["input_ids"],
                    "completion_ids": completion,
                }

        elif "text" in columns:

            def tokenize(row: dict[str, Any]) -> dict[str, Any]:
                ids = tokenizer(row["text"])["input_ids"]
                if eos is not None and (not ids or ids[-1] != eos):
                    ids = ids + [eos]
                return {"prompt_ids": [], "completion_ids": ids}

        else:
            raise ValueError(
                f"loss_type='mdlm' needs prompt_ids/completion_ids, prompt/completion or text columns; the {name} "
                f"dataset has {sorted(columns)}"
            )
        return dataset.map(tokenize, num_proc=args.dataset_num_proc, desc=f"Tokenizing {name} dataset")

    def _set_generation_defaults(
        self, inner: PreTrainedModel, args: T3DConfig, metadata: TrajectoryMetadata | None
    ) -> None:
        current = DiffusionGenerationConfig.from_model_config(inner.config)
        max_new = metadata.max_new_tokens if metadata is not None else current.max_new_tokens
        max_new = -(-max_new // self.block_length) * self.block_length
        distilled = current.update(
            max_new_tokens=max_new,
            block_length=self.block_length,
            tokens_per_step=args.tokens_per_step,
            threshold=None,
            **({"remasking": metadata.remasking} if metadata is not None else {}),
        )
        distilled.save_to_model_config(inner.config)

    def _build_reference(self) -> torch.nn.Module:
        student = unwrap_model(self.accelerator.unwrap_model(self.model))
        if self._zero3:
            # A ZeRO-3 student is sharded: load the architecture again, the first sync copies the weights.
            from trl.trainer.utils import create_model_from_path

            reference = create_model_from_path(get_config_model_id(student.config), dtype=student.dtype)
        else:
            reference = copy.deepcopy(student)
        reference.requires_grad_(False)
        reference.eval()
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(reference, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(reference, self.accelerator)
        return self.accelerator.prepare_model(reference, evaluation_mode=True)

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = list(_COLUMNS)

    # ---- the reference model ----------------------------------------------------------------------------------

    @property
    def _zero3(self) -> bool:
        return self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3

    def _reference_pairs(self) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
        """(student parameters, reference parameters) in matching order."""
        student = self.accelerator.unwrap_model(self.model)
        _reshard(student, *([] if self.ref_model is None else [self.ref_model]))
        if self._ref_adapter:
            named = dict(student.named_parameters())
            trained = f".{self._trained_adapter}."
            sources = [p for n, p in named.items() if trained in n]
            targets = [
                named[n.replace(trained, f".{_REF_ADAPTER}.")] for n, p in named.items() if trained in n
            ]
            return sources, targets
        return list(student.parameters()), list(self.accelerator.unwrap_model(self.ref_model).parameters())

    def sync_reference(self) -> None:
        """Copy the student's current weights into the reference model (the start of a new DDO round)."""
        sources, targets = self._reference_pairs()
        _copy_parameters(sources, targets, zero3=self._zero3)
        self._ref_synced_at = self.state.global_step

    def _reference_module(self) -> torch.nn.Module:
        """The module holding the reference weights: the student (adapter ``"ref"``) or the reference model."""
        module = self.accelerator.unwrap_model(self.model if self._ref_adapter else self.ref_model)
        _reshard(module)
        return module if self._ref_adapter else unwrap_model(module)

    def _reference_state(self) -> dict[str, torch.Tensor]:
        """The reference adapter's, or the sharded reference model's, full weights on the main process's CPU.

        Under FSDP2 the weights are sharded (``DTensor``): every process must call this, the shards are gathered.
        """
        module = self._reference_module()
        if self._ref_adapter:  # small: gathered parameter by parameter
            marker = f".{_REF_ADAPTER}."
            state = {n: _full_tensor(p) for n, p in module.named_parameters() if marker in n}
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            # Gathered onto the main process's CPU only; the other processes get an empty dict.
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            state = get_model_state_dict(module, options=options)
        if not self.args.should_save:
            return {}
        seen: set[int] = set()  # tied weights share storage, which safetensors refuses: store a copy
        for name, tensor in state.items():
            state[name] = tensor.clone() if tensor.data_ptr() in seen else tensor.contiguous()
            seen.add(tensor.data_ptr())
        return state

    def _save_reference(self, folder: str) -> None:
        """Write ``t3d_reference.safetensors`` into ``folder`` (main process; every process must call it)."""
        module = self._reference_module()
        sharded = _is_sharded(module)
        if self._zero3 or (self.is_fsdp_enabled and not sharded):
            logger.warning("the reference model is sharded (ZeRO-3/FSDP1): not saved; a resume re-syncs it")
            return
        path = os.path.join(folder, REFERENCE_FILE)
        metadata = {
            "synced_at": str(self._ref_synced_at),
            "kind": "adapter" if self._ref_adapter else "model",
        }
        if not (self._ref_adapter or sharded):
            if self.args.should_save:
                safetensors.torch.save_model(module, path, metadata=metadata)
            return
        state = self._reference_state()
        if self.args.should_save:
            safetensors.torch.save_file(state, path, metadata=metadata)

    def _load_reference(self, folder: str) -> None:
        path = os.path.join(folder, REFERENCE_FILE)
        if not os.path.isfile(path):
            logger.warning(
                "%s has no %s: the reference model is re-synced from the student", folder, REFERENCE_FILE
            )
            self.sync_reference()
            return
        with safetensors.safe_open(path, framework="pt") as f:
            synced_at = f.metadata().get("synced_at")
        module = self._reference_module()
        if self._ref_adapter:
            named = dict(module.named_parameters())
            for name, value in safetensors.torch.load_file(path).items():
                _copy_into(named[name], value)
        elif _is_sharded(module):  # every process reads the file and keeps its own shards
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            state = safetensors.torch.load_file(path)
            set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=False))
        else:
            safetensors.torch.load_model(module, path, device=str(next(module.parameters()).device))
        self._ref_synced_at = int(synced_at) if synced_at not in (None, "None") else None

    # ---- loss ---------------------------------------------------------------------------------------------------

    def _mask_dtype(self, model: torch.nn.Module) -> torch.dtype:
        if torch.is_autocast_enabled(self.accelerator.device.type):
            return torch.get_autocast_dtype(self.accelerator.device.type)
        return unwrap_model(self.accelerator.unwrap_model(model)).dtype

    def _logits(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        inner = unwrap_model(self.accelerator.unwrap_model(model))
        is_decoder = accepts_4d_mask(inner)
        mask = diffusion_attention_mask(
            inputs, self.block_length, self.diffusion.is_block_causal, self._mask_dtype(model), is_decoder
        )
        logits, _ = diffusion_forward(
            model,
            self.diffusion,
            inputs["input_ids"],
            mask,
            inputs["position_ids"],
            keep=inputs["keep"],
        )
        return logits

    @torch.no_grad()
    def _reference_logits(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if self._ref_adapter:
            student = self.accelerator.unwrap_model(self.model)
            with (
                use_adapter(student, _REF_ADAPTER),
                disable_gradient_checkpointing(student, self.args.gradient_checkpointing_kwargs),
            ):
                return self._logits(student, inputs)
        return self._logits(self.ref_model, inputs)

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> torch.Tensor | None:
        """Counts over the whole accumulated step (and all processes): masked tokens, target tokens, sequences.

        Student states are made here, before counting, so that the loss is normalised by the states trained on.
        """
        if not batch_samples or "loss_mask" not in batch_samples[0]:
            return None
        if self.teacher_model is not None:
            for index, batch in enumerate(batch_samples):
                batch.update(self.student_states(self.model, self._prepare_inputs(batch), index))
        counts = torch.stack(
            [
                sum(b["loss_mask"].sum() for b in batch_samples),
                sum(b["target_mask"].sum() for b in batch_samples),
                sum(b["loss_mask"].any(-1).sum() for b in batch_samples),
            ]
        ).to(device=device, dtype=torch.float32)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            counts = self.accelerator.reduce(counts, reduction="sum")
        return counts

    @torch.no_grad()
    def student_states(
        self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], micro_batch: int = 0
    ) -> dict[str, torch.Tensor]:
        """Move a share ``student_state_ratio`` of the rows one parallel step of the student off the teacher's
        trajectory, and relabel them with the frozen teacher (see ``T3DConfig.student_state_ratio``).

        In each block of a selected row that is being decoded (block-causal: every noisy block; bidirectional: the
        first block holding a mask), the student commits its ``tokens_per_step`` most confident masked tokens
        (greedy, as ``diffusion_generate`` does), provided at least one mask is left after it. The committed
        positions leave the loss; in the blocks that moved, the targets of the masked positions become the
        teacher's argmax at the new state (blocks that did not move keep the teacher's trajectory tokens).
        Rows are chosen by a generator keyed on ``(seed, global_step, micro_batch, process)``, so a resumed run
        draws the same rows. The training loop calls it on every micro-batch before counting the loss's items.
        """
        key = ((self.args.seed * 1_000_003 + self.state.global_step) * 1_009 + micro_batch) * 1_013
        generator = torch.Generator().manual_seed(key + self.accelerator.process_index)
        chosen = torch.rand(inputs["input_ids"].shape[0], generator=generator) < self.args.student_state_ratio
        chosen = chosen.to(inputs["loss_mask"].device)
        if not chosen.any():
            return inputs
        batch = {k: v if k == "keep" else v[chosen] for k, v in inputs.items()}
        loss_mask, keep = batch["loss_mask"], batch["keep"]
        logits = self._logits(model, batch).float()
        confidence, proposal = logits.softmax(-1).max(-1)
        if self.diffusion.is_block_causal:
            block = batch["position_ids"][:, keep] // self.block_length
        else:  # blocks start at the completion (the first kept column); later blocks wait for the current one
            block = torch.arange(keep.numel(), device=keep.device).expand_as(loss_mask) // self.block_length
            first = torch.where(loss_mask, block, torch.full_like(block, block.max() + 1)).min(
                -1, keepdim=True
            )
            loss_mask = loss_mask & (block == first.values)
        score = confidence.masked_fill(~loss_mask, -1.0)
        commit = torch.zeros_like(loss_mask)
        moved = torch.zeros_like(loss_mask)  # blocks whose state moved: only they are relabelled
        positions = torch.arange(score.shape[-1], device=score.device).expand_as(score)
        for b in block.unique().tolist():
            in_block = (block == b) & loss_mask
            steps = in_block.sum(-1, keepdim=True) > self.args.tokens_per_step
            ranked = score.masked_fill(block != b, -1.0).argsort(-1, descending=True)
            rank = torch.empty_like(ranked).scatter_(-1, ranked, positions)
            commit |= in_block & (rank < self.args.tokens_per_step) & steps
            moved |= (block == b) & steps
        columns = batch["input_ids"][:, keep]
        batch["input_ids"] = batch["input_ids"].clone()
        batch["input_ids"][:, keep] = torch.where(commit, proposal, columns)
        batch["loss_mask"] = batch["loss_mask"] & ~commit
        labels = self._logits(self.teacher_model, batch).argmax(-1)
        batch["targets"] = torch.where(batch["loss_mask"] & moved, labels, batch["targets"])
        out = dict(inputs)
        for name in ("input_ids", "loss_mask", "targets"):
            out[name] = inputs[name].clone()
            out[name][chosen] = batch[name]
        self._record({"student_states": chosen.float().mean()})
        return out

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        args = self.args
        loss_mask, targets = inputs["loss_mask"], inputs["targets"]
        local = torch.stack([loss_mask.sum(), inputs["target_mask"].sum(), loss_mask.any(-1).sum()]).float()
        if num_items_in_batch is None:  # evaluation: this batch alone
            counts, scale = local, 1.0
        else:
            counts = num_items_in_batch
            gathered = args.average_tokens_across_devices and args.world_size > 1
            scale = float(self.accelerator.num_processes) if gathered else 1.0
        # Global normalisers; times the number of processes because DDP averages the gradients over processes.
        n_masked, n_target, n_seq = (counts.clamp_min(1) / scale).unbind()

        logits = self._logits(model, inputs)
        selected = logits[loss_mask].float()
        logp_all = selected.log_softmax(-1)
        real = torch.zeros(loss_mask.shape, device=logits.device)
        real = real.masked_scatter(
            loss_mask, logp_all.gather(-1, targets[loss_mask].unsqueeze(-1)).squeeze(-1)
        )

        terms: dict[str, torch.Tensor] = {}  # sums, normalised below
        metrics: dict[str, torch.Tensor] = {}
        if args.loss_type in REFERENCE_LOSSES:
            ref_selected = self._reference_logits(inputs)[loss_mask].float()
            ref_logp_all = ref_selected.log_softmax(-1)

            def scatter(values: torch.Tensor) -> torch.Tensor:
                return torch.zeros(loss_mask.shape, device=values.device, dtype=values.dtype).masked_scatter(
                    loss_mask, values
                )

            ref_real = scatter(ref_logp_all.gather(-1, targets[loss_mask].unsqueeze(-1)).squeeze(-1))
            if args.fake_estimator == "expectation":
                fake = scatter(losses.expected_logratio(logp_all, ref_logp_all))
                ref_fake = torch.zeros_like(fake)
            else:
                fake_tokens = ref_selected.argmax(-1, keepdim=True)  # the reference's own parallel prediction
                fake = scatter(logp_all.gather(-1, fake_tokens).squeeze(-1))
                ref_fake = scatter(ref_logp_all.gather(-1, fake_tokens).squeeze(-1))
            real_ratio = losses.sequence_logratio(real, ref_real, loss_mask)
            fake_ratio = losses.sequence_logratio(fake, ref_fake, loss_mask)
            has_state = loss_mask.any(-1)
            per_seq = losses.ddo_loss(real_ratio, fake_ratio, args.beta, args.fake_weight)
            terms["ddo"] = (per_seq * has_state).sum() / n_seq
            metrics["loss/ddo"] = (per_seq * has_state).sum() / local[2].clamp_min(1)
            metrics["logratio/real"] = (real_ratio * has_state).sum() / local[2].clamp_min(1)
            metrics["logratio/fake"] = (fake_ratio * has_state).sum() / local[2].clamp_min(1)
            if args.loss_type == "t3d":
                step = inputs["path_step"]
                weights = losses.path_weights(
                    step, self.block_length // args.tokens_per_step, args.path_weighting
                )
                path = losses.path_consistency_loss(real, loss_mask, weights, num_items=1)
                terms["path"] = args.lambda_path * path / n_masked
                metrics["loss/path"] = path / local[0].clamp_min(1)
        elif args.loss_type == "mdlm":
            total = losses.mdlm_loss(real, loss_mask, inputs["mask_prob"], num_items=1)
            terms["mdlm"] = total / n_target
            metrics["loss/mdlm"] = total / local[1].clamp_min(1)
        elif args.loss_type == "dparallel":
            total = losses.certainty_forcing_loss(
                logits, targets, loss_mask, args.certainty_weight, args.certainty_temperature, num_items=1
            )
            ce = losses.trajectory_kl_loss(real, loss_mask, num_items=1)
            terms["dparallel"] = total / n_masked
            metrics["loss/ce"] = ce / local[0].clamp_min(1)
            metrics["loss/certainty"] = (total - ce) / local[0].clamp_min(1)
        else:  # td, redi: forward KL on trajectory or random states
            total = losses.trajectory_kl_loss(real, loss_mask, num_items=1)
            terms[args.loss_type] = total / n_masked
            metrics[f"loss/{args.loss_type}"] = total / local[0].clamp_min(1)
        loss = sum(terms.values())

        with torch.no_grad():
            metrics["masked_token_accuracy"] = (selected.argmax(-1) == targets[loss_mask]).float().mean()
            metrics["masked_entropy"] = -(logp_all.exp() * logp_all).sum(-1).mean()
            self._record(metrics)
        return (loss, {"logits": logits}) if return_outputs else loss

    def _record(self, metrics: dict[str, torch.Tensor]) -> None:
        mode = "train" if self.model.training else "eval"
        names = sorted(metrics)
        values = torch.stack([metrics[n].detach().float().nan_to_num(0.0) for n in names])
        values = self.accelerator.gather(values.unsqueeze(0)).mean(0)
        for name, value in zip(names, values.tolist()):
            self._metrics[mode][name].append(value)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        metrics = {k: sum(v) / len(v) for k, v in self._metrics[mode].items() if v}
        if mode == "eval":
            metrics = {f"eval_{k}": v for k, v in metrics.items()}
        logs.update(metrics)
        super().log(logs, start_time)
        self._metrics[mode].clear()

    def evaluate(self, *args, **kwargs):
        # Evaluation states are drawn as in epoch 0 every time, so evaluations are comparable across training.
        collator = self.data_collator
        epoch = getattr(collator, "epoch", None)
        if epoch is not None:
            collator.epoch = 0
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            if epoch is not None:
                collator.epoch = epoch

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    # ---- checkpoints and the model card ---------------------------------------------------------------------------

    @contextmanager
    def _without_reference_adapter(self):
        """Saved models hold the trained adapter only; the reference adapter is checkpoint state."""
        model = self.accelerator.unwrap_model(self.model)
        if not self._ref_adapter or _REF_ADAPTER not in model.peft_config:
            yield
            return
        config = model.peft_config.pop(_REF_ADAPTER)
        try:
            yield
        finally:
            model.peft_config[_REF_ADAPTER] = config

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        with self._without_reference_adapter():
            super()._save(output_dir, state_dict)
        model = self.accelerator.unwrap_model(self.model)
        if is_peft_model(
            model
        ):  # an adapter has no config.json: keep the distilled decoding defaults with it
            save_adapter_defaults(model, output_dir or self.args.output_dir)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """:meth:`transformers.Trainer.train`, safe to rerun into the same ``output_dir``.

        ``resume_from_checkpoint``: a checkpoint folder, or ``True`` (also the strings ``"true"``/``"false"`` a
        command line gives) for the last complete checkpoint in ``output_dir``. Without it, an ``output_dir`` that
        already holds checkpoints is refused unless ``args.overwrite_output_dir``, which deletes them first: a
        fresh run must not leave an older run's later checkpoints for a resume to pick up.
        """
        if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() in ("true", "false"):
            resume_from_checkpoint = resume_from_checkpoint.lower() == "true" or None
        output_dir = self.args.output_dir
        if resume_from_checkpoint is True:
            resume_from_checkpoint = _last_complete_checkpoint(output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"resume_from_checkpoint=True but {output_dir} holds no complete checkpoint-* folder"
                )
        elif not resume_from_checkpoint:
            old = _checkpoints(output_dir)
            if old and not self.args.overwrite_output_dir:
                raise ValueError(
                    f"{output_dir} already holds {', '.join(p.name for p in old)}: pass "
                    "resume_from_checkpoint=True (--resume_from_checkpoint true) to continue from the last one, "
                    "or overwrite_output_dir=True (--overwrite_output_dir true) to delete them and start over"
                )
            if old and self.args.should_save:
                logger.warning("overwrite_output_dir: deleting %s", ", ".join(str(p) for p in old))
                for path in old:
                    shutil.rmtree(path)
            self.accelerator.wait_for_everyone()
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model, trial):
        folder = os.path.join(
            self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        )
        existed = os.path.isdir(folder)
        try:
            name = (
                Path(self.args.output_dir).name if self.args.hub_model_id is None else self.args.hub_model_id
            )
            self.create_model_card(model_name=name.split("/")[-1])
            if self._needs_reference:
                # Written first, so a checkpoint pushed to the Hub by the base class carries the reference too.
                if self.args.should_save:
                    os.makedirs(folder, exist_ok=True)
                self._save_reference(
                    folder
                )  # every process: a sharded reference is gathered for the main one
            super()._save_checkpoint(model, trial)
        except BaseException:
            # No half-written checkpoint-N/ is left behind for a resume to pick up (Ctrl-C included).
            if not existed and self.args.should_save:
                shutil.rmtree(folder, ignore_errors=True)
            raise

    def _load_optimizer_and_scheduler(self, checkpoint):
        # Runs on every resume, after the model weights are restored: restore the reference with them.
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and self._needs_reference:
            self._load_reference(checkpoint)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        if not _internal_call and output_dir in (None, self.args.output_dir):
            self.create_model_card()

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
    ) -> None:
        """Write ``README.md`` into ``output_dir``: tags, the paper, the T3D settings and how to sample."""
        if not self.is_world_process_zero():
            return
        from huggingface_hub import ModelCard, ModelCardData

        inner = unwrap_model(self.accelerator.unwrap_model(self.model))
        base_model = get_config_model_id(inner.config)
        base_model = base_model if base_model and not os.path.isdir(base_model) else None
        tags = {tags} if isinstance(tags, str) else set(tags or [])
        tags.update(self._tag_names)
        generation = DiffusionGenerationConfig.from_model_config(inner.config)
        metadata = self.trajectory_metadata
        settings = {
            name: getattr(self.args, name)
            for name in (
                "loss_type",
                "beta",
                "fake_weight",
                "fake_estimator",
                "lambda_path",
                "path_weighting",
                "ref_sync_steps",
                "state_sampling",
                "random_token_prob",
                "tokens_per_step",
                "max_prompt_length",
                "max_completion_length",
                "learning_rate",
                "per_device_train_batch_size",
                "gradient_accumulation_steps",
                "num_train_epochs",
                "max_steps",
                "seed",
            )  # fmt: skip
        }
        settings["block_length"] = self.block_length
        card = ModelCard.from_template(
            ModelCardData(
                base_model=base_model,
                datasets=dataset_name,
                library_name="transformers",
                tags=["generated_from_trainer", *sorted(tags)],
            ),
            template_path=str(_MODEL_CARD_TEMPLATE),
            model_name=model_name or Path(self.args.output_dir).name,
            base_model=base_model,
            hub_model_id=self.hub_model_id or model_name or Path(self.args.output_dir).name,
            dataset_name=dataset_name,
            adapter=is_peft_model(self.accelerator.unwrap_model(self.model)),
            chat_template=bool(getattr(self.processing_class, "chat_template", None)),
            distilled=self.args.loss_type != "mdlm",
            generation=generation,
            steps_per_block=generation.block_length // generation.tokens_per_step
            if generation.block_length and generation.tokens_per_step
            else None,
            settings=json.dumps(settings, indent=2),
            teacher=metadata.teacher if metadata else None,
            trajectory=metadata.to_dict() if metadata else None,
            citation=self._paper["citation"],
            paper_title=self._paper["title"],
        )
        card.save(os.path.join(self.args.output_dir, "README.md"))
