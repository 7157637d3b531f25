"""A training process's device, threads, allocator, determinism, precision and compile; the step sees a StepContext."""

import contextlib
import functools
import logging
import os

import torch
from torch import nn

from gan.config import Precision, TrainConfig
from gan.core.models import Discriminator
from gan.core.steps import StepContext
from gan.device import retain_freed_memory, setup_torch
from gan.distributed import SINGLE, World, rank_device

log = logging.getLogger(__name__)


def prepare_process(cfg: TrainConfig, world: World = SINGLE) -> torch.device:
    trainer = cfg.trainer
    # each rank draws its own latents; initial weights may differ too, as DDP copies rank 0's
    device = setup_torch(trainer.device, trainer.threads, trainer.seed + world.rank, "trainer.device")
    device = rank_device(world, device)
    if device.type == "cpu" and trainer.retain_host_memory and retain_freed_memory():
        log.debug("glibc malloc: freed blocks are kept for reuse (trainer.retain_host_memory=true)")
    if trainer.deterministic:
        # cuBLAS needs a fixed workspace; on the CPU every kernel used here is deterministic already
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = device.type == "cuda" and not trainer.deterministic
    return device


def resolve_precision(precision: Precision, device: torch.device) -> Precision:
    if precision != Precision.auto:
        return precision
    if device.type == "cuda":
        fast = torch.cuda.get_device_capability(device)[0] >= 8  # Ampere and later: bf16 tensor cores
    else:
        fast = device.type == "cpu" and cpu_has_fast_bf16()
    return Precision.bf16 if fast else Precision.fp32


def cpu_has_fast_bf16() -> bool:
    """AMX or AVX512-bf16 instructions, which oneDNN uses for bf16 convolutions."""
    try:
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    except AttributeError:  # private helpers: absent in other torch versions
        return False


def step_context(precision: Precision, device: torch.device, skip_nonfinite: bool) -> StepContext:
    """A GradScaler enabled only for fp16; the training state adds the objective with dataclasses.replace."""
    dtype = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}.get(precision)
    autocast = (
        functools.partial(torch.autocast, device_type=device.type, dtype=dtype) if dtype else contextlib.nullcontext
    )
    scaler = torch.amp.GradScaler(device.type, enabled=precision == Precision.fp16)
    return StepContext(autocast=autocast, scaler=scaler, skip_nonfinite=skip_nonfinite)


def compile_models(G: nn.Module, D: Discriminator) -> None:
    """Apart, not the whole step (it would split after G's forward); D's parts, so both its calls run compiled."""
    G.compile()
    D.features.compile()
    D.head.compile()
