"""The processes of a collection: ``accelerate launch`` / ``torchrun`` start one per GPU (or several on the CPU),
and each takes every ``world_size``-th batch; what they must agree on is agreed here."""

from __future__ import annotations

import os
from typing import Any

import torch


def process_group() -> tuple[int, int, Any]:
    """``(rank, world_size, barrier)`` from torch.distributed, joining the launcher's group if needed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Under `accelerate launch` / `torchrun`: join the launcher's group (env:// rendezvous). Done here
        # rather than through accelerate's PartialState, a process-wide singleton that may already hold a
        # one-process state (a forked worker inherits it).
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), dist.barrier
    return 0, 1, lambda: None


def is_first_process() -> bool:
    """Whether this is rank 0, read from the launcher's environment: safe where no collective may run (an
    interrupt, which every process receives), so that a message is printed once, not once per process."""
    return int(os.environ.get("RANK", "0")) == 0


def smallest_over_processes(value: int) -> int:
    """The smallest of every process's ``value`` (``value`` itself without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    values: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return min(values)
