"""The DDO reference model of :class:`~t3d_trl.T3DTrainer`: build, refresh, gather, save and load.

The reference is a frozen copy of the student, refreshed from it every ``ref_sync_steps`` optimizer steps. With
PEFT it is a second adapter (``"ref"``) on the same base weights instead of a second model. Under FSDP2 its
weights are sharded like the student's (``DTensor``), under DeepSpeed ZeRO-3 they are partitioned: refreshing
and saving gather them, loading hands each process its own shards. Checkpoints store it in
``t3d_reference.safetensors``, so a resume restores the reference of the round it stopped in.

The frozen teacher that labels student states (``student_state_ratio``) is built the same way
(:func:`build_frozen_copy`), but never refreshed.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import safetensors
import safetensors.torch
import torch
from trl.models.utils import prepare_deepspeed, prepare_fsdp
from trl.trainer.utils import get_config_model_id

from ..diffusion.forward import unwrap_model

if TYPE_CHECKING:
    from .t3d_trainer import T3DTrainer

logger = logging.getLogger(__name__)

REFERENCE_FILE = "t3d_reference.safetensors"
REF_ADAPTER = "ref"


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether FSDP2 has sharded ``module``'s parameters (they are ``DTensor``s)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on the CPU, gathered from its shards if FSDP2 sharded it (a collective call)."""
    from torch.distributed.tensor import DTensor

    tensor = tensor.detach()
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).cpu()


def reshard(*modules: torch.nn.Module) -> None:
    """Shard FSDP2 weights that are still gathered: after a forward without backward (the reference's), FSDP2
    keeps the root module's weights whole, and they would not pair with the other model's shards."""
    from torch.distributed.fsdp import FSDPModule

    for module in modules:
        for sub in module.modules():
            if isinstance(sub, FSDPModule):
                sub.reshard()


@torch.no_grad()
def copy_into(target: torch.Tensor, value: torch.Tensor) -> None:
    """``target <- value`` for a whole ``value``; a sharded ``target`` takes its own shard (no communication)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        value = distribute_tensor(value, target.device_mesh, target.placements, src_data_rank=None)
    target.data.copy_(value)


@torch.no_grad()
def copy_parameters(
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


def add_reference_adapter(model: Any) -> str:
    """Give a ``PeftModel`` the ``"ref"`` adapter (a copy of its trained adapter's config); returns the trained
    adapter's name, which stays active."""
    if len(model.peft_config) != 1:
        raise ValueError(f"expected one trained adapter, found {sorted(model.peft_config)}")
    trained = model.active_adapter
    model.add_adapter(REF_ADAPTER, model.peft_config[trained])
    model.set_adapter(trained)
    return trained


@contextmanager
def saving_trained_adapter_only(model: Any, trained: str):
    """While ``model`` is saved, ``save_pretrained`` writes the ``trained`` adapter only: saved models hold no
    ``"ref"`` adapter (it is checkpoint state, in ``t3d_reference.safetensors``).

    peft's ``selected_adapters``, not hiding ``"ref"`` from ``peft_config``: peft filters another adapter's
    tensors out of a saved adapter by the names in ``peft_config``.
    """
    model.save_pretrained = functools.partial(model.save_pretrained, selected_adapters=[trained])
    try:
        yield
    finally:
        del model.save_pretrained  # the class's method again


def build_frozen_copy(trainer: T3DTrainer) -> torch.nn.Module:
    """A frozen, evaluation-mode copy of the student, prepared like it (DeepSpeed, FSDP or plain)."""
    student = unwrap_model(trainer.accelerator.unwrap_model(trainer.model))
    if trainer.is_zero3:
        # A ZeRO-3 student is sharded: load the architecture again, the first sync copies the weights.
        from trl.trainer.utils import create_model_from_path

        reference = create_model_from_path(get_config_model_id(student.config), dtype=student.dtype)
    else:
        reference = copy.deepcopy(student)
    reference.requires_grad_(False)
    reference.eval()
    if trainer.is_deepspeed_enabled:
        return prepare_deepspeed(reference, trainer.accelerator)
    if trainer.is_fsdp_enabled:
        return prepare_fsdp(reference, trainer.accelerator)
    return trainer.accelerator.prepare_model(reference, evaluation_mode=True)


class ReferenceModel:
    """The reference weights of a :class:`~t3d_trl.T3DTrainer`: the ``"ref"`` adapter of the student
    (``trained_adapter`` names the adapter it copies) or the trainer's ``ref_model``.

    It reads the trainer's current ``model``, ``ref_model``, ``accelerator`` and ``args`` at each call (accelerate
    wraps the model after the trainer is built). ``synced_at`` is the optimizer step of the last refresh.
    """

    def __init__(self, trainer: T3DTrainer, trained_adapter: str | None = None):
        self.trainer = trainer
        self.trained_adapter = trained_adapter
        self.synced_at: int | None = None

    @property
    def is_adapter(self) -> bool:
        return self.trained_adapter is not None

    def pairs(self) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
        """(student parameters, reference parameters) in matching order."""
        trainer = self.trainer
        student = trainer.accelerator.unwrap_model(trainer.model)
        reshard(student, *([] if trainer.ref_model is None else [trainer.ref_model]))
        if self.is_adapter:
            named = dict(student.named_parameters())
            trained = f".{self.trained_adapter}."
            sources = [p for n, p in named.items() if trained in n]
            targets = [named[n.replace(trained, f".{REF_ADAPTER}.")] for n in named if trained in n]
            return sources, targets
        reference = trainer.accelerator.unwrap_model(trainer.ref_model)
        return list(student.parameters()), list(reference.parameters())

    def sync(self) -> None:
        """Copy the student's current weights into the reference (the start of a new DDO round)."""
        sources, targets = self.pairs()
        copy_parameters(sources, targets, zero3=self.trainer.is_zero3)
        self.synced_at = self.trainer.state.global_step

    def module(self) -> torch.nn.Module:
        """The module holding the reference weights: the student (adapter ``"ref"``) or the reference model."""
        trainer = self.trainer
        module = trainer.accelerator.unwrap_model(trainer.model if self.is_adapter else trainer.ref_model)
        reshard(module)
        return module if self.is_adapter else unwrap_model(module)

    def state(self) -> dict[str, torch.Tensor]:
        """The reference adapter's, or the sharded reference model's, full weights on the main process's CPU.

        Under FSDP2 the weights are sharded (``DTensor``): every process must call this, the shards are gathered.
        """
        module = self.module()
        if self.is_adapter:  # small: gathered parameter by parameter
            marker = f".{REF_ADAPTER}."
            state = {n: full_tensor(p) for n, p in module.named_parameters() if marker in n}
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            # Gathered onto the main process's CPU only; the other processes get an empty dict.
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            state = get_model_state_dict(module, options=options)
        if not self.trainer.args.should_save:
            return {}
        seen: set[int] = set()  # tied weights share storage, which safetensors refuses: store a copy
        for name, tensor in state.items():
            state[name] = tensor.clone() if tensor.data_ptr() in seen else tensor.contiguous()
            seen.add(tensor.data_ptr())
        return state

    def save(self, folder: str) -> None:
        """Write ``t3d_reference.safetensors`` into ``folder`` (main process; every process must call it)."""
        trainer = self.trainer
        module = self.module()
        sharded = is_sharded(module)
        if trainer.is_zero3 or (trainer.is_fsdp_enabled and not sharded):
            logger.warning("the reference model is sharded (ZeRO-3/FSDP1): not saved; a resume re-syncs it")
            return
        path = os.path.join(folder, REFERENCE_FILE)
        if trainer.args.should_save:  # a folder of the caller's, not only a checkpoint the trainer made
            os.makedirs(folder, exist_ok=True)
        metadata = {"synced_at": str(self.synced_at), "kind": "adapter" if self.is_adapter else "model"}
        if not (self.is_adapter or sharded):
            if trainer.args.should_save:
                safetensors.torch.save_model(module, path, metadata=metadata)
            return
        state = self.state()
        if trainer.args.should_save:
            safetensors.torch.save_file(state, path, metadata=metadata)

    def load(self, folder: str) -> None:
        """Restore the reference saved in ``folder``; a checkpoint without one re-syncs it from the student."""
        path = os.path.join(folder, REFERENCE_FILE)
        if not os.path.isfile(path):
            logger.warning(
                "%s has no %s: the reference model is re-synced from the student", folder, REFERENCE_FILE
            )
            self.sync()
            return
        with safetensors.safe_open(path, framework="pt") as f:
            synced_at = f.metadata().get("synced_at")
        module = self.module()
        if self.is_adapter:
            named = dict(module.named_parameters())
            for name, value in safetensors.torch.load_file(path).items():
                copy_into(named[name], value)
        elif is_sharded(module):  # every process reads the file and keeps its own shards
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            state = safetensors.torch.load_file(path)
            set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=False))
        else:
            safetensors.torch.load_model(module, path, device=str(next(module.parameters()).device))
        self.synced_at = int(synced_at) if synced_at not in (None, "None") else None
