"""The training state, saved and restored together; and its process, which the step sees as a StepContext."""

import contextlib
import dataclasses
import functools
import logging
import os
import random
import re
from typing import Any, Optional

import torch
from torch import Tensor, nn
from torch.amp import GradScaler
from torch.optim import Adam
from torch.optim.swa_utils import AveragedModel
from tqdm import tqdm

from gan.checkpoint import load_checkpoint, load_module_state, require_training_state
from gan.config import OnNonFinite, Precision, TrainConfig, to_plain
from gan.core.augment import AdaptiveAugment, diff_augment, no_augment
from gan.core.ema import build_ema
from gan.core.losses import LOSSES, d_loss_bce
from gan.core.models import Discriminator, Generator
from gan.core.sampling import class_rows
from gan.core.steps import Penalties, StepContext
from gan.data import BatchStream, ImageSet, load_dataset
from gan.device import environment, environment_changes, retain_freed_memory, setup_torch
from gan.errors import CheckpointError, ConfigError, DataError
from gan.launch import check_resume
from gan.training.threads import keep_thread_count
from gan.world import SINGLE, World

log = logging.getLogger(__name__)

ANOTHER = "Resume from another checkpoint (checkpoints/step_NNNNNN.pt, trainer.keep_checkpoints), or start a new run."


@dataclasses.dataclass
class TrainingState:
    G: Generator
    D: Discriminator
    G_ema: Optional[AveragedModel]  # None when model.ema_decay=0 and model.ema_kimg=0
    opt_g: torch.optim.Optimizer
    opt_d: torch.optim.Optimizer
    scaler: GradScaler  # enabled for fp16 only; shared with the StepContext
    batches: BatchStream
    fixed_z: Tensor  # every sample grid's z, so grids compare across steps and resumes
    step: int = 0  # generator updates done, in this run and the runs it resumed
    fixed_y: Optional[Tensor] = None  # conditional: each fixed latent's class; rebuilt, not checkpointed
    best: Optional[dict[str, float]] = None  # best.pt's FID and step: a resume replaces it only with a better one
    augment: Optional[AdaptiveAugment] = None  # the StepContext's ADA, whose p is checkpointed
    pack: Optional[str] = None  # data=packed: the content hash of the pack; a resume needs the same

    @property
    def sampler(self) -> nn.Module:
        return self.G_ema.module if self.G_ema is not None else self.G

    def state_dict(self, cfg: TrainConfig, rank_rngs: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
        return {  # rank_rngs: every rank's rng_state() under DDP: each draws its own latents
            **{key: getattr(self, key).state_dict() for key in ("G", "D", "opt_g", "opt_d")},
            "G_ema": self.G_ema.state_dict() if self.G_ema is not None else None,
            "scaler": self.scaler.state_dict(),  # empty unless fp16
            "step": self.step,
            "num_classes": self.G.num_classes,  # 0: unconditional; evaluate.py rebuilds G from it
            "data": self.batches.state_dict(),
            "fixed_z": self.fixed_z,
            "rng": rank_rngs[0] if rank_rngs else rng_state(self.fixed_z.device, self.augment),
            "rng_ranks": rank_rngs if rank_rngs and len(rank_rngs) > 1 else [],
            "config": to_plain(cfg),
            "best": dict(self.best) if self.best else None,
            "augment": self.augment.state_dict() if self.augment is not None else None,  # ADA's p
            "environment": environment(self.fixed_z.device),  # versions, device, commit: a resume compares them
            "threads": torch.get_num_threads(),  # part of the arithmetic on the CPU: a resume keeps it (threads.py)
            "pack": self.pack,
        }

    def load_state_dict(self, state: dict[str, Any], world: World = SINGLE) -> None:
        """Per-rank generators only if saved for a job this size; a misfit of model.* is damage (gan/launch.py)."""
        advice = "The run's model.* and data.* are the checkpoint's (the resume contract): it was damaged or edited. "
        if self.G.num_classes:  # a conditional run's class count comes from the data
            advice += "Or data.root holds another dataset than the run trained on: point it back at the run's. "
        if state.get("pack") != self.pack:  # data.root may change on a resume; the images may not
            raise DataError(
                f"trainer.resume: data.root holds another pack (hash {str(self.pack)[:12]}) than the run's (hash "
                f"{str(state.get('pack'))[:12]}). Nothing was trained. Set data.root to the run's pack, or drop it."
            )
        try:  # `entry`: the one being read, named when it fails
            for entry, name in (("G", "generator"), ("D", "discriminator"), ("G_ema", "EMA generator")):
                if entry != "G_ema" or (self.G_ema is not None and state.get("G_ema") is not None):
                    load_module_state(getattr(self, entry), state[entry], name, advice + ANOTHER)
            if self.G_ema is not None and state.get("G_ema") is None:  # a run without EMA continues with one: from G
                self.G_ema.n_averaged.zero_()
                self.G_ema.update_parameters(self.G)
            for entry in ("opt_g", "opt_d"):  # torch's load_state_dict does not check moments' shapes, and Adam's
                optimizer, saved = getattr(self, entry), state[entry]  # fused update then writes past one's memory
                params = [param for group in optimizer.param_groups for param in group["params"]]
                for param, index in zip(params, [i for group in saved["param_groups"] for i in group["params"]]):
                    for slot, moment in saved["state"].get(index, {}).items():
                        if isinstance(moment, Tensor) and moment.dim() and moment.shape != param.shape:
                            shapes = f"has shape {tuple(moment.shape)}, where its parameter has {tuple(param.shape)}"
                            raise CheckpointError(f"trainer.resume: {entry}.state[{index}].{slot} {shapes}. {ANOTHER}")
                optimizer.load_state_dict(saved)
            if self.scaler.is_enabled() and state.get(entry := "scaler"):
                self.scaler.load_state_dict(state["scaler"])
            entry, position, sampler = "data", state["data"], self.batches.sampler
            if position["batch"] > (most := sampler.size // sampler.batch_size):
                raise CheckpointError(
                    f"trainer.resume: its entry 'data' places the batch stream at batch {position['batch']}"
                    f" of epoch {position['epoch']}, past an epoch's end: {sampler.size} images make {most} batches "
                    f"of data.batch_size={sampler.batch_size}. Point data.root at the run's data. {ANOTHER}"
                )
            self.batches.load_state_dict(position)
            self.fixed_z = state[entry := "fixed_z"].to(self.fixed_z.device).reshape(self.fixed_z.shape)
            entry, per_rank = "rng", state.get("rng_ranks") or []
            if len(per_rank) == world.size and world.size > 1:
                set_rng_state(per_rank[world.rank], self.fixed_z.device, self.augment)
            elif world.rank == 0:
                set_rng_state(state["rng"], self.fixed_z.device, self.augment)
            self.step = int(state[entry := "step"])
            best = state[entry := "best"]
            self.best = {"fid": float(best["fid"]), "step": int(best["step"])} if best else None
            if self.augment is not None:  # ADA's p: a run with model.ada_target continues from its own
                self.augment.load_state_dict(state[entry := "augment"])
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as err:
            detail = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no detail'}"
            raise CheckpointError(
                f"trainer.resume: the checkpoint's entry {entry!r} is missing or damaged ({detail}). " + ANOTHER
            ) from err


def rng_state(device: torch.device, augment: Optional[AdaptiveAugment] = None) -> dict[str, Any]:
    """Python's, torch's, the training GPU's (get_rng_state_all() would touch every GPU) and ADA's generators."""
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state(device)] if device.type == "cuda" else [],
        "augment": augment.generator.get_state() if augment is not None else None,
    }


def set_rng_state(rng: dict[str, Any], device: torch.device, augment: Optional[AdaptiveAugment]) -> None:
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"].cpu())
    if rng["cuda"] and device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"][0].cpu(), device)
    saved = rng.get("augment")
    if augment is not None and saved is not None:
        # ADA's generator is the device's: a CPU one's state (5056 bytes) and a CUDA one's (16) do not fit each other
        if saved.numel() == augment.generator.get_state().numel():  # else from its seed (a device move is not exact)
            augment.generator.set_state(saved.cpu())
    elif augment is not None:  # written before the augmentation had a generator of its own
        log.warning(
            "trainer.resume: the checkpoint holds no state of the augmentation's generator (an older "
            "version's): its draws restart from the seed, not bit-identical to an uninterrupted run."
        )


def build_state(
    cfg: TrainConfig, device: torch.device, scaler: GradScaler, world: World = SINGLE, dataset: ImageSet | None = None
) -> TrainingState:
    dataset, data, model = dataset or load_dataset(cfg.data), cfg.data, cfg.model
    num_classes = dataset.num_classes if model.conditional else 0
    if model.conditional and num_classes < 2:
        where = f" in {cfg.data.root}" if cfg.data.name in ("folder", "celeba") else ""
        raise ConfigError(
            f"model.conditional=true needs class labels, and data={cfg.data.name}{where} has none ({num_classes} "
            "class). Nothing was trained. Put the images in one subfolder per class (data=folder), or drop it."
        )
    labels = dataset.labels if num_classes else None  # the classes travel with the batch
    batches = BatchStream(
        dataset.images, data.batch_size, cfg.trainer.seed, device, data.num_workers, world.rank, world.size, labels
    )
    G, D = build_models(cfg, device, num_classes)
    images_per_step = data.batch_size * world.size  # G_ema: copied before compiling: it stays eager
    G_ema = build_ema(G, model.ema_decay, model.ema_kimg, model.ema_rampup, images_per_step, model.ema_every)
    if cfg.trainer.compile:
        compile_models(G, D)
    opt_g, opt_d = build_optimizer(G, cfg, device), build_optimizer(D, cfg, device, lr=cfg.optim.lr_d)
    seeded = torch.Generator(device).manual_seed(cfg.trainer.seed)  # z made on the device, not moved there
    fixed_z = torch.randn(cfg.trainer.num_fixed_samples, cfg.model.z_dim, device=device, generator=seeded)
    fixed_z, fixed_y = class_rows(fixed_z, num_classes) if num_classes else (fixed_z, None)  # a row per class
    return TrainingState(G, D, G_ema, opt_g, opt_d, scaler, batches, fixed_z, fixed_y=fixed_y, pack=dataset.pack)


def build_models(cfg: TrainConfig, device: torch.device, num_classes: int = 0) -> tuple[Generator, Discriminator]:
    model, shape = cfg.model, (cfg.data.channels, cfg.data.image_size)
    G = Generator(model.z_dim, model.g_width, *shape, num_classes)
    d_options = (model.d_batchnorm, model.spectral_norm, model.pack, model.minibatch_std)
    D = Discriminator(model.d_width, *shape, *d_options, num_classes)
    if model.sync_batchnorm:  # one set of batch statistics across all ranks of a DDP job
        G, D = nn.SyncBatchNorm.convert_sync_batchnorm(G), nn.SyncBatchNorm.convert_sync_batchnorm(D)
    layout = memory_format(cfg, device)
    return G.to(device, memory_format=layout), D.to(device, memory_format=layout)


def memory_format(cfg: TrainConfig, device: torch.device) -> torch.memory_format:
    # not compiled on a GPU: inductor mispredicts channels_last ConvTranspose2d's backward strides (pytorch#171622)
    if cfg.trainer.channels_last and cfg.trainer.compile and device.type != "cpu":
        log.info("trainer.compile on %s: the models stay in contiguous (NCHW) memory, not channels_last", device.type)
        return torch.contiguous_format
    return torch.channels_last if cfg.trainer.channels_last else torch.contiguous_format


def build_optimizer(module: nn.Module, cfg: TrainConfig, device: torch.device, lr: Optional[float] = None) -> Adam:
    fused = device.type in ("cpu", "cuda")  # one kernel for the whole update; elsewhere foreach. Same math
    betas, foreach = (cfg.optim.beta1, cfg.optim.beta2), None if fused else True
    return Adam(module.parameters(), lr=lr or cfg.optim.lr, betas=betas, fused=fused or None, foreach=foreach)


def lr_scale(step: int, max_steps: int, decay: float) -> float:
    """1, then linear to 1 / (decay * max_steps) over the last `decay` of the run; nothing to checkpoint."""
    start = max_steps * (1.0 - decay)
    return 1.0 if decay <= 0 or step < start else max(max_steps - step, 1) / (max_steps - start)


def set_learning_rates(state: TrainingState, cfg: TrainConfig) -> None:
    scale = lr_scale(state.step, cfg.trainer.max_steps, cfg.optim.lr_decay)
    for optimizer, base in ((state.opt_g, cfg.optim.lr), (state.opt_d, cfg.optim.lr_d or cfg.optim.lr)):
        for group in optimizer.param_groups:
            group["lr"] = base * scale


def build_step_context(cfg: TrainConfig, device: torch.device, rank: int = 0) -> tuple[StepContext, Precision]:
    precision = resolve_precision(cfg.trainer.precision, device)
    ctx = step_context(precision, device, skip_nonfinite=cfg.trainer.on_nan == OnNonFinite.skip)
    loss, penalties = cfg.loss, Penalties(cfg.loss.gradient_penalty, cfg.loss.r1)
    adversarial = LOSSES[loss.name.value]
    if loss.name.value == "bce" and loss.real_label != 1.0:  # one-sided label smoothing
        adversarial = adversarial._replace(d=functools.partial(d_loss_bce, real_label=loss.real_label))
    objective = dict(loss=adversarial, penalties=penalties, feature_matching=loss.feature_matching)
    # DiffAugment, adaptive with model.ada_target: ADA's generator seeded apart, so its numbers are not the latents'
    model, policies = cfg.model, [policy.value for policy in cfg.model.diffaugment]
    augment = functools.partial(diff_augment, policies=policies) if policies else no_augment
    if policies and model.ada_target > 0:
        seed = cfg.trainer.seed + rank + 0xA06_5EED  # any constant
        augment = AdaptiveAugment(policies, model.ada_target, model.ada_kimg, cfg.data.batch_size, seed=seed).to(device)
    return dataclasses.replace(ctx, **objective, backward_mode=loss.backward_mode, augment=augment), precision


def prepare_process(cfg: TrainConfig, world: World = SINGLE) -> torch.device:
    trainer, seed = cfg.trainer, cfg.trainer.seed + world.rank  # each rank draws its own latents (DDP copies weights)
    device = setup_torch(trainer.device, trainer.threads, seed, "trainer.device")
    device = torch.device("cuda", world.local_rank) if world.distributed and device.type == "cuda" else device
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
    if device.type == "cuda":  # Ampere on: bf16 cores
        return Precision.bf16 if torch.cuda.get_device_capability(device)[0] >= 8 else Precision.fp32
    # AMX or AVX512-bf16, which oneDNN uses for bf16 convolutions (torch's private helpers: absent in some versions)
    helpers = [getattr(torch.cpu, f"_is_{unit}_supported", None) for unit in ("amx_tile", "avx512_bf16")]
    fast = device.type == "cpu" and any(helper is not None and helper() for helper in helpers)
    return Precision.bf16 if fast else Precision.fp32


def step_context(precision: Precision, device: torch.device, skip_nonfinite: bool) -> StepContext:
    dtype = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}.get(precision)
    autocast = functools.partial(torch.autocast, device.type, dtype) if dtype else contextlib.nullcontext
    scaler = GradScaler(device.type, enabled=precision == Precision.fp16)  # the objective: build_step_context's
    return StepContext(autocast=autocast, scaler=scaler, skip_nonfinite=skip_nonfinite)


def compile_models(G: nn.Module, D: Discriminator) -> None:
    """Apart, not the whole step (it would split after G's forward); D's parts, so both its calls run compiled."""
    for part in (G, D.features, D.head):
        part.compile()


def set_up(
    cfg: TrainConfig, world: World, dataset: Optional[ImageSet]
) -> tuple[torch.device, StepContext, TrainingState, ImageSet]:
    device = prepare_process(cfg, world)
    # read the checkpoint to resume from before any work, so a bad path fails at once
    resume_from = load_checkpoint(cfg.trainer.resume, map_location=device) if cfg.trainer.resume else None
    ctx, precision = build_step_context(cfg, device, world.rank)
    try:
        training_set = dataset or load_dataset(cfg.data)
        state = build_state(cfg, device, ctx.scaler, world, training_set)
    except RuntimeError as err:  # torch.OutOfMemoryError (CUDA, MPS) is one; the CPU allocator's is not
        if not isinstance(err, torch.OutOfMemoryError) and "can't allocate memory" not in str(err):
            raise
        asked = re.search(r"allocate ((\d+) bytes|[\d.]+ [KMGTPE]?i?B)", str(err), re.IGNORECASE)
        size = f" = {tqdm.format_sizeof(int(asked[2]), 'B', 1000)}" if asked and asked[2] else ""  # the CPU's bytes
        amount, data, model = f" (it asked for {asked[1]}{size})" if asked else "", cfg.data, cfg.model
        raise ConfigError(
            f"Not enough memory to build the models and the fixed latents{amount}: lower model.g_width={model.g_width},"
            f" model.d_width={model.d_width}, data.image_size={data.image_size}, data.batch_size={data.batch_size} or "
            f"trainer.num_fixed_samples={cfg.trainer.num_fixed_samples}."
        ) from err
    state.augment = ctx.augment if isinstance(ctx.augment, AdaptiveAugment) else None
    if resume_from is not None:
        require_training_state(resume_from, cfg.trainer.resume)
        check_resume(to_plain(cfg), resume_from, cfg.trainer.resume)
        state.load_state_dict(resume_from, world)
        keep_thread_count(resume_from.get("threads"), cfg.trainer.threads, cfg.trainer.adapt_threads)
        log.info("Resumed from %s at step %d", cfg.trainer.resume, state.step)
        if changes := environment_changes(resume_from.get("environment"), environment(device)):
            log.warning("Resumed in another environment (%s): not bit for bit an unbroken run.", "; ".join(changes))
    set_learning_rates(state, cfg)  # the first step's; the periodic extras set each next one
    auto = " (trainer.precision=auto)" if cfg.trainer.precision == Precision.auto else ""
    log.info("Training on %s in %s%s, %d process(es)", device, precision.value, auto, world.size)
    return device, ctx, state, training_set
