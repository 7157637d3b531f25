"""torch.distributed for torchrun: process group, this process's rank and device, agreement.

Owns everything rank-aware that is not the training math. Launch with `torchrun --nproc_per_node=N
train.py ...`; a plain `python train.py` is a world of one and none of this does anything.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class World:
    rank: int = 0  # this process among all of them
    size: int = 1  # number of processes
    local_rank: int = 0  # this process among those on its machine: its GPU index

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes TensorBoard, samples and checkpoints."""
        return self.rank == 0


SINGLE = World()


def world_from_env() -> World:
    """The World torchrun describes in RANK / WORLD_SIZE / LOCAL_RANK (a world of one without it).

    Tasks that submitit starts on SLURM (hydra/launcher=slurm) carry SLURM's variables instead;
    submitit's own helper exports torch.distributed's from them (MASTER_ADDR/PORT too).
    """
    if "RANK" not in os.environ and "SUBMITIT_EXECUTOR" in os.environ and int(os.environ.get("SLURM_NTASKS", 1)) > 1:
        from submitit.helpers import TorchDistributedEnvironment  # installed with the slurm extra

        TorchDistributedEnvironment().export()
    return World(
        int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    )


def init_process_group(world: World, device_name: str) -> None:
    """Join the job's process group: nccl when this rank trains on a GPU, gloo on the CPU."""
    if not world.distributed or dist.is_initialized():
        return
    on_gpu = device_name != "cpu" and torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(world.local_rank)
    dist.init_process_group(backend="nccl" if on_gpu else "gloo")


def rank_device(world: World, device: torch.device) -> torch.device:
    """Each rank on a machine takes its own GPU (cuda:LOCAL_RANK); CPU ranks share the CPU."""
    if world.distributed and device.type == "cuda":
        return torch.device("cuda", world.local_rank)
    return device


def broadcast_object(value: Any, world: World) -> Any:
    """Rank 0's value, on every rank (e.g. its Hydra run directory)."""
    if not world.distributed:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def gather_to_main(value: Any, world: World) -> Optional[list[Any]]:
    """Every rank's `value`, in rank order, on rank 0 (None elsewhere). A collective: every rank
    must call it at the same point."""
    if not world.distributed:
        return [value]
    gathered: Optional[list[Any]] = [None] * world.size if world.is_main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def any_rank(flag: bool, world: World, device: torch.device) -> bool:
    """True on every rank if it is True on any: ranks must stop at the same step, or the ones
    still training wait forever in an all-reduce for the ones that left."""
    if not world.distributed:
        return flag
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def mean_over_ranks(value: Tensor, world: World) -> Tensor:
    """The mean of a tensor over all ranks (one all-reduce); the tensor itself in a single process."""
    if not world.distributed:
        return value
    total = value.clone()
    dist.all_reduce(total)
    return total / world.size


def close(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()
