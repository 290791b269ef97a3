"""The trainer's data: datasets checked against the student and prepared, the collator, and the decoding defaults
the trajectories give the distilled student (what ``T3DTrainer.__init__`` sets up before transformers' ``Trainer``).
"""

from __future__ import annotations

from typing import Any

import datasets
from transformers import PreTrainedModel

from ..data.collator import DataCollatorForDiffusion
from ..data.preparation import (
    TRAINING_COLUMNS,
    check_trajectory_metadata,
    prepare_training_dataset,
    resolve_block_length,
)
from ..data.schema import TrajectoryMetadata
from ..generation.configuration import DiffusionGenerationConfig
from .t3d_config import TRAJECTORY_LOSSES, T3DConfig


class DataMixin:
    """Mixed into :class:`~t3d_trl.trainer.T3DTrainer` before transformers' ``Trainer``."""

    def _default_collator(
        self, args: T3DConfig, processing_class: Any, inner: PreTrainedModel
    ) -> DataCollatorForDiffusion:
        pad_id = getattr(processing_class, "pad_token_id", None)
        pad_id = inner.config.pad_token_id if pad_id is None else pad_id
        vocab = self._vocab_size
        return DataCollatorForDiffusion(
            diffusion=self.diffusion,
            block_length=self.block_length,
            pad_token_id=int(pad_id if pad_id is not None else 0),
            states=dict(redi="random", mdlm="random", dparallel="semi_ar").get(args.loss_type, "trajectory"),
            state_sampling=args.state_sampling,
            random_token_prob=args.random_token_prob,
            vocab_size=min(len(processing_class), vocab) if processing_class is not None else vocab,
            tokens_per_step=args.tokens_per_step,
            schedule=DiffusionGenerationConfig.from_model_config(inner.config).schedule,
            seed=args.seed,
        )

    def _prepare_dataset(
        self, dataset: datasets.Dataset, args: T3DConfig, tokenizer: Any, name: str
    ) -> datasets.Dataset:
        return prepare_training_dataset(
            dataset,
            name,
            loss_type=args.loss_type,
            trajectory_states=args.loss_type in TRAJECTORY_LOSSES,
            tokenizer=tokenizer,
            vocab_size=self._vocab_size,
            diffusion=self.diffusion,
            block_length=self.block_length,
            max_positions=self._max_positions,
            max_prompt_length=args.max_prompt_length,
            max_completion_length=args.max_completion_length,
            num_proc=args.dataset_num_proc,
        )

    def _check_trajectories(
        self, dataset: datasets.Dataset, block_length: int | None, args: T3DConfig
    ) -> tuple[TrajectoryMetadata | None, int]:
        """A dataset's metadata checked against the student (attention, block length, vocabulary, mask token),
        and the block length it trains or is evaluated at."""
        metadata = TrajectoryMetadata.from_dataset(dataset) if hasattr(dataset, "info") else None
        block = resolve_block_length(
            block_length, metadata, self.diffusion, args.loss_type in TRAJECTORY_LOSSES
        )
        check_trajectory_metadata(metadata, self.diffusion, self._vocab_size)
        return metadata, block

    def _prepare_eval_dataset(
        self, dataset: datasets.Dataset, args: T3DConfig, tokenizer: Any, name: str
    ) -> datasets.Dataset:
        """An evaluation set, checked against the student at the training block length, then prepared as the
        training set is."""
        self._check_trajectories(dataset, self.block_length, args)
        return self._prepare_dataset(dataset, args, tokenizer, name)

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

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = list(TRAINING_COLUMNS)
