"""``T3DTrainer``: trajectory self-distillation of a masked diffusion LM into a few-step student (TRL trainer)."""

from __future__ import annotations

import logging
import math
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate.utils import is_peft_model
from transformers import PreTrainedTokenizerBase, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.trainer.base_trainer import _BaseTrainer
from trl.trainer.utils import disable_dropout_in_model, get_config_model_id, use_adapter

from ..data.collator import DataCollatorForDiffusion, diffusion_attention_mask
from ..diffusion.forward import accepts_4d_mask, diffusion_forward, max_positions, unwrap_model
from ..models.auto import (
    ADAPTER_DEFAULTS_FILE,
    AutoModelForDiffusionLM,
    check_pushable_adapter,
    load_tokenizer,
    remote_code_files,
    save_adapter_defaults,
)
from ..utils import without_checkpointing_deprecation
from . import checkpoints, losses
from .checks import check_launch, check_student
from .data import DataMixin
from .evaluation import MetricsMixin
from .model_card import PAPER, write_model_card
from .reference import (
    REF_ADAPTER,
    REFERENCE_FILE,
    ReferenceModel,
    add_reference_adapter,
    build_frozen_copy,
    copy_parameters,
    saving_trained_adapter_only,
)
from .student_states import chosen_rows, committed_count, make_student_states
from .t3d_config import REFERENCE_LOSSES, T3DConfig

logger = logging.getLogger(__name__)

__all__ = ["REFERENCE_FILE", "T3DTrainer"]  # REFERENCE_FILE: re-exported from .reference


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


class T3DTrainer(DataMixin, MetricsMixin, _BaseTrainer):
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
    _paper = PAPER
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
                processing_class = load_tokenizer(model)
            model = AutoModelForDiffusionLM.from_pretrained(model, dtype="auto")

        # The model: a diffusion description is what makes it a masked diffusion LM.
        inner = unwrap_model(model)
        self.diffusion, self._vocab_size = check_student(inner)
        self._max_positions = max_positions(inner)
        self._needs_reference = args.loss_type in REFERENCE_LOSSES
        model = self._wrap_peft(model, peft_config, args)
        if args.push_to_hub:  # before training: an adapter of a local base loads nowhere else
            check_pushable_adapter(model)

        # Data: trajectories checked against the student, then prepared (data.preparation).
        metadata, self.block_length = self._check_trajectories(train_dataset, args.block_length, args)
        self.trajectory_metadata = metadata
        if args.loss_type != "mdlm" and self.block_length % args.tokens_per_step:
            raise ValueError(
                f"block_length={self.block_length} is not a multiple of tokens_per_step={args.tokens_per_step}"
            )
        # The main process prepares first; the others then reuse the cache of mdlm's tokenisation.
        with args.main_process_first(desc="dataset preparation"):
            train_dataset = self._prepare_dataset(train_dataset, args, processing_class, "train")
            if isinstance(eval_dataset, dict):
                eval_dataset = {
                    k: self._prepare_eval_dataset(v, args, processing_class, k)
                    for k, v in eval_dataset.items()
                }
            elif eval_dataset is not None:
                eval_dataset = self._prepare_eval_dataset(eval_dataset, args, processing_class, "eval")
        if data_collator is None:
            data_collator = self._default_collator(args, processing_class, inner)

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
        self._build_frozen_models(args)
        self.add_callback(_T3DCallback(self))
        self._init_metrics()
        self._micro_batch = 0  # index of the micro-batch in the accumulated step (keys the student states)
        if hasattr(self.model, "add_model_tags"):
            self.model.add_model_tags(self._tag_names)

    # ---- setup ----------------------------------------------------------------------------------------------

    def _wrap_peft(self, model: torch.nn.Module, peft_config: Any, args: T3DConfig) -> torch.nn.Module:
        """Apply ``peft_config``; with PEFT the reference is a second adapter on the same base weights."""
        if peft_config is not None:
            if is_peft_model(model):
                raise ValueError("pass either a PeftModel or a peft_config, not both")
            from peft import get_peft_model
            from transformers.trainer_utils import enable_full_determinism, set_seed

            # The adapter's initialisation is random: seeded as Trainer seeds (later), or runs and ranks differ.
            (enable_full_determinism if args.full_determinism else set_seed)(args.seed)
            with without_checkpointing_deprecation():  # peft reads a deprecated transformers attribute
                model = get_peft_model(model, peft_config)
        self._ref_adapter = self._needs_reference and is_peft_model(model)
        self._trained_adapter = add_reference_adapter(model) if self._ref_adapter else None
        if is_peft_model(model) and args.gradient_checkpointing:
            model.enable_input_require_grads()
        if args.disable_dropout:
            lora_dropout = max(
                (getattr(c, "lora_dropout", 0) or 0 for c in getattr(model, "peft_config", {}).values()),
                default=0,
            )
            if lora_dropout > 0:  # zeroed below, while adapter_config.json still records it
                logger.warning(
                    "disable_dropout=True zeroes the adapter's lora_dropout=%s (adapter_config.json still records "
                    "it): set disable_dropout=False to keep it",
                    lora_dropout,
                )
            disable_dropout_in_model(model)
        return model

    def _build_frozen_models(self, args: T3DConfig) -> None:
        """The reference model (DDO) and the frozen teacher that labels student states, both initial students."""
        self.reference = ReferenceModel(self, self._trained_adapter)
        self.ref_model = None
        if self._needs_reference and not self._ref_adapter:
            self.ref_model = build_frozen_copy(self)
        # The frozen teacher that labels student states: the initial student (self-distillation), never refreshed.
        self.teacher_model = None
        if args.student_state_ratio > 0:
            if is_peft_model(self.model):
                raise ValueError("student_state_ratio > 0 is not supported with PEFT adapters yet")
            self.teacher_model = build_frozen_copy(self)
            student = list(self.accelerator.unwrap_model(self.model).parameters())
            teacher = list(self.accelerator.unwrap_model(self.teacher_model).parameters())
            copy_parameters(student, teacher, zero3=self.is_zero3)
        if self._needs_reference:
            self.sync_reference()  # round 0: the reference is the initial student (a resume loads its own)

    def _check_launch(self) -> None:
        """Stop a multi-process launch that would not train one model together (it would train N copies)."""
        check_launch(
            self.args.world_size,
            self.args.output_dir,
            fsdp=self.is_fsdp_enabled,
            deepspeed=self.is_deepspeed_enabled,
            distributed_type=self.accelerator.distributed_type.value,
        )

    # ---- the reference model (trainer.reference.ReferenceModel) -----------------------------------------------

    @property
    def is_zero3(self) -> bool:
        """Whether DeepSpeed ZeRO-3 partitions the parameters."""
        return self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3

    def sync_reference(self) -> None:
        """Copy the student's current weights into the reference model (the start of a new DDO round)."""
        self.reference.sync()

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
            # Activation checkpointing stays on: under no_grad it saves nothing and gives the same logits.
            # Switching it off and on (TRL's disable_gradient_checkpointing) re-enabled it with the raw kwargs,
            # which fails on keys transformers pops, and added an input-embedding hook to a PeftModel each time.
            with use_adapter(student, REF_ADAPTER), warnings.catch_warnings():
                # Reentrant checkpointing warns that no input requires grad: true and harmless under no_grad.
                warnings.filterwarnings(
                    "ignore", message="None of the inputs have requires_grad", category=UserWarning
                )
                return self._logits(student, inputs)
        return self._logits(self.ref_model, inputs)

    def _student_state_rows(self, num_rows: int, micro_batch: int, device: Any) -> torch.Tensor:
        """The rows of micro-batch ``micro_batch`` that get student states (keyed: a resumed run draws the same)."""
        key = ((self.args.seed * 1_000_003 + self.state.global_step) * 1_009 + micro_batch) * 1_013
        return chosen_rows(
            num_rows, self.args.student_state_ratio, key + self.accelerator.process_index, device
        )

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> torch.Tensor | None:
        """Counts over the whole accumulated step (and all processes): masked tokens, target tokens, sequences.

        With student states, the positions they will commit are left out already: how many there are depends on
        the batch alone (:func:`~t3d_trl.trainer.student_states.committed_count`), so the loss is normalised by
        the states ``training_step`` trains on.
        """
        if not batch_samples or "loss_mask" not in batch_samples[0]:
            return None
        self._micro_batch = 0
        masked = sum(b["loss_mask"].sum() for b in batch_samples)
        if self.teacher_model is not None:
            for index, batch in enumerate(batch_samples):
                chosen = self._student_state_rows(
                    batch["input_ids"].shape[0], index, batch["loss_mask"].device
                )
                masked = masked - committed_count(
                    batch,
                    chosen,
                    self.block_length,
                    self.diffusion.is_block_causal,
                    self.args.tokens_per_step,
                )
        counts = torch.stack(
            [
                torch.as_tensor(masked),
                sum(b["target_mask"].sum() for b in batch_samples),
                sum(b["loss_mask"].any(-1).sum() for b in batch_samples),
            ]
        ).to(device=device, dtype=torch.float32)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            counts = self.accelerator.reduce(counts, reduction="sum")
        return counts

    def training_step(
        self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        # Student states are made here, as TRL's GKD trainer makes its on-policy samples: one micro-batch at a time.
        if self.teacher_model is not None:
            inputs = self.student_states(self.model, self._prepare_inputs(inputs), self._micro_batch)
            self._micro_batch += 1
        return super().training_step(model, inputs, num_items_in_batch)

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
        teacher's argmax at the new state, or the tokens of its own sequential completion of it
        (``student_state_labels``); blocks that did not move keep the teacher's trajectory tokens.
        Rows are chosen by a generator keyed on ``(seed, global_step, micro_batch, process)``, so a resumed run
        draws the same rows. ``training_step`` calls it on every micro-batch.
        """
        chosen = self._student_state_rows(
            inputs["input_ids"].shape[0], micro_batch, inputs["loss_mask"].device
        )
        # The share of rows moved, a training metric: recorded on every micro-batch and process (it gathers).
        self._record({"student_states": (chosen.sum(), torch.ones_like(chosen).sum())}, mode="train")
        if not chosen.any():
            return inputs
        out, _ = make_student_states(
            inputs,
            chosen,
            lambda batch: self._logits(model, batch),
            lambda batch: self._logits(self.teacher_model, batch),
            self.block_length,
            self.diffusion.is_block_causal,
            self.args.tokens_per_step,
            self.diffusion.mask_token_id,
            labels=self.args.student_state_labels,
        )
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
        metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # (sum, count) of this batch
        if args.loss_type in REFERENCE_LOSSES:
            ref_selected = self._reference_logits(inputs)[loss_mask].float()
            real_ratio, fake_ratio = losses.ddo_logratios(
                logp_all, ref_selected, real, targets[loss_mask], loss_mask, args.fake_estimator
            )
            has_state = loss_mask.any(-1)
            per_seq = losses.ddo_loss(real_ratio, fake_ratio, args.beta, args.fake_weight)
            terms["ddo"] = (per_seq * has_state).sum() / n_seq
            metrics["loss/ddo"] = ((per_seq * has_state).sum(), local[2])
            metrics["logratio/real"] = ((real_ratio * has_state).sum(), local[2])
            metrics["logratio/fake"] = ((fake_ratio * has_state).sum(), local[2])
            if args.loss_type == "t3d":
                step = inputs["path_step"]
                weights = losses.path_weights(
                    step, self.block_length // args.tokens_per_step, args.path_weighting
                )
                path = losses.path_consistency_loss(real, loss_mask, weights, num_items=1)
                terms["path"] = args.lambda_path * path / n_masked
                metrics["loss/path"] = (path, local[0])
        elif args.loss_type == "mdlm":
            total = losses.mdlm_loss(real, loss_mask, inputs["mask_prob"], num_items=1)
            terms["mdlm"] = total / n_target
            metrics["loss/mdlm"] = (total, local[1])
        elif args.loss_type == "dparallel":
            total = losses.certainty_forcing_loss(
                logits, targets, loss_mask, args.certainty_weight, args.certainty_temperature, num_items=1
            )
            ce = losses.trajectory_kl_loss(real, loss_mask, num_items=1)
            terms["dparallel"] = total / n_masked
            metrics["loss/ce"] = (ce, local[0])
            metrics["loss/certainty"] = (total - ce, local[0])
        else:  # td, redi: forward KL on trajectory or random states
            total = losses.trajectory_kl_loss(real, loss_mask, num_items=1)
            terms[args.loss_type] = total / n_masked
            metrics[f"loss/{args.loss_type}"] = (total, local[0])
        loss = sum(terms.values())

        with torch.no_grad():
            correct = (selected.argmax(-1) == targets[loss_mask]).sum()
            metrics["masked_token_accuracy"] = (correct, local[0])
            metrics["masked_entropy"] = (torch.special.entr(logp_all.exp()).sum(), local[0])  # 0 log 0 = 0
            self._record(metrics)
        return (loss, {"logits": logits}) if return_outputs else loss

    # ---- checkpoints (trainer.checkpoints) and the model card -------------------------------------------------

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)  # the model saved
        if self._ref_adapter:  # saved models hold the trained adapter only
            with saving_trained_adapter_only(model, self._trained_adapter):
                super()._save(output_dir, state_dict)
        else:
            super()._save(output_dir, state_dict)
        if is_peft_model(model):  # an adapter has no config.json: its distilled decoding defaults go here
            save_adapter_defaults(model, output_dir or self.args.output_dir)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        # transformers copies a fixed list of model files into output_dir and uploads that: an adapter's
        # decoding defaults and a checkpoint's own modeling code (auto_map) must travel with it.
        if self.is_world_process_zero():
            for name in [ADAPTER_DEFAULTS_FILE, *remote_code_files(checkpoint_folder)]:
                source = os.path.join(checkpoint_folder, name)
                if os.path.isfile(source):
                    shutil.copy(source, os.path.join(self.args.output_dir, name))
        super()._push_from_checkpoint(checkpoint_folder)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """:meth:`transformers.Trainer.train`, safe to rerun into the same ``output_dir``.

        ``resume_from_checkpoint``: a checkpoint folder, or ``True`` (also the strings ``"true"``/``"false"`` a
        command line gives) for the last checkpoint in ``output_dir`` that loads (a damaged one is skipped with a
        warning). Without it, an ``output_dir`` that already holds checkpoints or a finished model is refused
        unless ``args.overwrite_output_dir``, which deletes them first: a fresh run must not leave an older run's
        later checkpoints for a resume to pick up, nor replace a finished model unasked. A resume with other
        settings than its checkpoint's (objective, states, optimisation) is refused, naming each difference, and so is
        a resume from a checkpoint already at ``max_steps``.
        """
        output_dir, overwrite = self.args.output_dir, self.args.overwrite_output_dir
        # Every process checks, so all of them stop; only the main one deletes what overwrite_output_dir clears.
        resume_from_checkpoint = checkpoints.check_output_dir(
            output_dir,
            resume_from_checkpoint,
            overwrite,
            self.args.max_steps,
            checkpoints.run_settings(self.args, self.block_length),
        )
        if resume_from_checkpoint is None:
            if overwrite:  # without it, check_output_dir has refused a folder that holds anything
                checkpoints.clear_for_fresh_run(output_dir, overwrite, self.args.should_save)
            self.accelerator.wait_for_everyone()
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model, trial):
        folder = os.path.join(
            self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        )
        with checkpoints.removed_on_failure(folder, self.args.should_save):
            name = (
                Path(self.args.output_dir).name if self.args.hub_model_id is None else self.args.hub_model_id
            )
            self.create_model_card(model_name=name.split("/")[-1])
            # Written first, so a checkpoint pushed to the Hub by the base class carries them too: the settings
            # a resume must keep, and the reference.
            if self.args.should_save:
                os.makedirs(folder, exist_ok=True)
                settings = checkpoints.run_settings(self.args, self.block_length)
                checkpoints.save_settings(folder, settings)
            if self._needs_reference:
                self.reference.save(folder)  # every process: a sharded reference is gathered for the main one
            super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        # Runs on every resume, after the model weights are restored: restore the reference with them.
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and self._needs_reference:
            self.reference.load(checkpoint)

    def _load_best_model(self) -> None:
        # transformers restores the student only: the reference of the same checkpoint goes with it.
        super()._load_best_model()
        if self._needs_reference:
            self.reference.load(self.state.best_model_checkpoint)

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
        """Write ``README.md`` into ``output_dir``: tags, the paper, the T3D settings and how to sample
        (:mod:`t3d_trl.trainer.model_card`)."""
        if not self.is_world_process_zero():
            return
        tags = {tags} if isinstance(tags, str) else set(tags or [])
        model = self.accelerator.unwrap_model(self.model)
        name = model_name or Path(self.args.output_dir).name
        write_model_card(
            self.args.output_dir,
            model_config=unwrap_model(model).config,
            args=self.args,
            block_length=self.block_length,
            metadata=self.trajectory_metadata,
            paper=self._paper,
            tags=tags | set(self._tag_names),
            model_name=name,
            hub_model_id=self.hub_model_id or name,
            dataset_name=dataset_name,
            adapter=is_peft_model(model),
            chat_template=bool(getattr(self.processing_class, "chat_template", None)),
            example_prompt=_first_prompt(self.train_dataset, self.processing_class),
        )


def _first_prompt(dataset: Any, tokenizer: Any) -> str | None:
    """The first training row's prompt as text (decoded from its ``prompt_ids``), for the model card's quick
    start; ``None`` without a tokenizer or such a row."""
    if tokenizer is None or "prompt_ids" not in (getattr(dataset, "column_names", None) or []):
        return None
    try:
        first = next(iter(dataset))
    except StopIteration:
        return None
    return tokenizer.decode(first["prompt_ids"], skip_special_tokens=True).strip() or None
