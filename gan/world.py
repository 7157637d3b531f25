"""Which process of a torchrun (or SLURM) job this is, read from the environment: no torch, so that a refusal at the
command line says itself at once. A plain `python train.py` is a world of one."""

import os
from typing import NamedTuple


class World(NamedTuple):
    rank: int = 0  # this process among all of them
    size: int = 1  # number of processes
    local_rank: int = 0  # this process among those on its machine: its GPU index

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:  # rank 0 alone writes TensorBoard, samples and checkpoints
        return self.rank == 0


SINGLE = World()


def world_from_env() -> World:
    """torchrun's RANK / WORLD_SIZE / LOCAL_RANK; submitit's SLURM tasks get them from its own helper."""
    env = os.environ  # export() below writes into it
    if "RANK" not in env and "SUBMITIT_EXECUTOR" in env and int(env.get("SLURM_NTASKS", 1)) > 1:
        from submitit.helpers import TorchDistributedEnvironment  # installed with the slurm extra

        TorchDistributedEnvironment().export()
    return World(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))
