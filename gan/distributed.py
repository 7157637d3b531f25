"""torch.distributed for torchrun, all that is rank-aware but the math; a plain `python train.py` is a world of one."""

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from gan.world import World
from gan.world import world_from_env as world_from_env  # torch-free: launch.py's refusals read it before torch loads


def init_process_group(world: World, device_name: str) -> None:
    if world.distributed and not dist.is_initialized():
        if on_gpu := device_name != "cpu" and torch.cuda.is_available():
            torch.cuda.set_device(world.local_rank)
        dist.init_process_group(backend="nccl" if on_gpu else "gloo")


def broadcast_object(value: Any, world: World) -> Any:
    holder = [value]
    if world.distributed:
        dist.broadcast_object_list(holder, src=0)
    return holder[0]


def gather_to_main(value: Any, world: World) -> Optional[list[Any]]:
    """In rank order on rank 0, None elsewhere; a collective, so every rank must call it."""
    if not world.distributed:
        return [value]
    gathered: Optional[list[Any]] = [None] * world.size if world.is_main else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def any_rank(flag: bool, world: World, device: torch.device) -> bool:
    """Ranks must stop at the same step, or the ones still training wait forever in an all-reduce."""
    if not world.distributed:
        return flag
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def mean_over_ranks(value: Tensor, world: World) -> Tensor:
    if not world.distributed:
        return value
    total = value.clone()
    dist.all_reduce(total)
    return total / world.size


def close(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()
