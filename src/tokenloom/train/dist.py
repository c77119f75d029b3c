"""The process group of a run: one process, or ``torchrun --nproc-per-node N`` (DDP).

``torchrun`` sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; with ``WORLD_SIZE > 1`` the group
is initialised here (``nccl`` on GPU, ``gloo`` on CPU) and each rank takes the loader's slice of
every global batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist

from tokenloom.process import env_topology
from tokenloom.train.config import TrainError

__all__ = ["Dist", "device_name", "parse_device", "resolve_device"]

_DEVICES = "auto, cpu, cuda or cuda:N"


def parse_device(device: str) -> torch.device | None:
    """The device a ``--device`` string names (``None`` for ``auto``), whether or not this
    machine has it.

    Raises:
        TrainError: The string names no device (``"gpu"``, ``"cuda:x"``).
    """
    if device == "auto":
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise TrainError(
            f"device {device!r} is not a device name ({exc}); use {_DEVICES}"
        ) from None


def device_name(device: torch.device) -> str:
    """The device's model name for the run record (``cpu`` for a CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """``auto`` → ``cuda:LOCAL_RANK`` when a GPU is visible, else ``cpu``.

    Raises:
        TrainError: ``device`` names no device, or a GPU this machine does not have.
    """
    dev = parse_device(device)
    if dev is None:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank)
    if dev.type == "cuda":
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if dev.index >= visible:
            raise TrainError(
                f"device {str(dev)!r} is not available: this machine has {visible} CUDA "
                f"device(s); pass --device auto (a GPU when there is one) or --device cpu"
            )
    return dev


@dataclass
class Dist:
    """This process's place in the run."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owned: bool = False
    """Whether :meth:`setup` created the process group (and :meth:`close` destroys it)."""

    @classmethod
    def setup(cls, device: str = "auto") -> Dist:
        rank, world = env_topology()
        local = int(os.environ.get("LOCAL_RANK") or 0)
        dev = resolve_device(device, local)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        if os.environ.get("TORCHELASTIC_RUN_ID"):  # a torchrun rank: end with its launcher
            from tokenloom.process import die_with_parent

            die_with_parent(os.getppid())
        owned = False
        if world > 1 and not torch_dist.is_initialized():
            torch_dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
            owned = True
        return cls(rank=rank, world_size=world, local_rank=local, device=dev, owned=owned)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        """The sum over ranks (in place; the identity on one process)."""
        if self.distributed:
            torch_dist.all_reduce(value, op=torch_dist.ReduceOp.SUM)
        return value

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order: a collective (``[value]`` on one
        process)."""
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.world_size
        torch_dist.all_gather_object(out, value)
        return out

    def barrier(self) -> None:
        if self.distributed:
            torch_dist.barrier()

    def close(self) -> None:
        if self.owned and torch_dist.is_initialized():
            torch_dist.destroy_process_group()
