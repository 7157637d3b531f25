"""Typed configuration: a dataclass per `configs/` group for Hydra's ConfigStore, with the checks Hydra cannot make."""

import math
import re
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from gan.core import BackwardMode
from gan.errors import ConfigError


class LossName(str, Enum):
    bce = "bce"  # non-saturating GAN loss (Goodfellow et al. 2014, sec. 3)
    hinge = "hinge"  # hinge loss (Lim & Ye 2017; Miyato et al. 2018)
    wgan_gp = "wgan_gp"  # Wasserstein loss; pair with loss.gradient_penalty (Gulrajani et al. 2017)


class DatasetName(str, Enum):
    digits = "digits"  # built in: rendered from a font, no download
    mnist = "mnist"  # torchvision's MNIST
    fashion_mnist = "fashion_mnist"  # torchvision's FashionMNIST
    cifar10 = "cifar10"  # torchvision's CIFAR10
    folder = "folder"  # any folder of images, flat or one subfolder per class
    celeba = "celeba"  # CelebA's aligned faces, read as a folder where torchvision puts them
    stacked = "stacked"  # Stacked-MNIST: three grayscale images as R, G, B (1000 modes)
    packed = "packed"  # any of the above decoded and resized once into one uint8 file (gan/data/pack.py)

    def __str__(self) -> str:  # `data={name}` in messages, not `data=DatasetName.digits` (Python 3.11+)
        return self.value


class DiffAugmentPolicy(str, Enum):
    color = "color"  # brightness, saturation, contrast, one random factor each per image
    translation = "translation"  # a shift of up to 1/8 of the side, zeros shifted in
    cutout = "cutout"  # a square of half the side set to zero


class OnNonFinite(str, Enum):
    stop = "stop"  # stop with an error naming the step; the last checkpoint stays the last good one
    skip = "skip"  # drop that step's update and go on (costs one host sync per step)


class OnDWon(str, Enum):
    off = "off"  # no watch
    warn = "warn"  # one warning per episode, a text summary and the scalar train/d_won in TensorBoard
    stop = "stop"  # the same, then end the run after that step with its checkpoint (exit code 4): sweeps save time


class Precision(str, Enum):
    auto = "auto"  # bf16 where the hardware runs it fast (CPU with AMX/AVX512-bf16, CUDA Ampere+), else fp32
    fp32 = "fp32"
    bf16 = "bf16"  # torch.autocast with bfloat16: no loss scaling needed (same exponent range as fp32)
    fp16 = "fp16"  # torch.autocast with float16 and a GradScaler (fp16 underflows small gradients)


class _Group:
    KEY = ""  # the group's prefix in messages: `data.` names data.batch_size

    def _check(self, ok: bool, name: str, why: str) -> None:
        _require(ok, self.KEY + name, getattr(self, name), why)

    def _at_least(self, low: int, *names: str, why: str = "") -> None:
        for name in names:
            self._check(getattr(self, name) >= low, name, why or (f"must be at least {low}" if low else "must be >= 0"))

    def _within_cpus(self, name: str, zero_means: str) -> None:
        """torch.set_num_threads takes any int, and a count far above the CPUs crashes its thread pool."""
        from gan.device import available_cpus  # here: importing torch would slow --help and each TAB of completion

        cpus, key = available_cpus(), self.KEY + name
        why = f"is more than the {cpus} CPU(s) this process may use on this machine: set {key} to a number from 1 to "
        self._check(getattr(self, name) <= cpus, name, why + f"{cpus}, or {zero_means}")


@dataclass
class DataConfig(_Group):
    KEY = "data."
    SOURCES = (DatasetName.digits, DatasetName.mnist, DatasetName.fashion_mnist)

    name: DatasetName = DatasetName.digits  # the dataset (configs/data/); `digits` is built in, no download
    root: str = "data"  # datasets folder in torchvision's layout, relative to the launch directory; folder: the images
    download: bool = False  # fetch a missing mnist/fashion_mnist/cifar10/celeba into root
    source: DatasetName = DatasetName.digits  # stacked: the dataset whose images become R, G and B, one of SOURCES
    image_size: int = 32  # side in pixels: a power of two, 16..256 (G doubles it per block from 4x4)
    channels: int = 1  # 1 grayscale, 3 RGB; other data is converted: gray repeated to RGB, RGB to luma
    in_memory: Optional[bool] = None  # uint8 images on the training device, else DataLoader; null = up to 512 MiB
    batch_size: int = 64  # images per process and step (docs/results.md#quality-in-one-minute)
    num_workers: Optional[int] = None  # DataLoader workers; null = 0 in memory, else half the cores (at most 8)
    num_samples: int = 60000  # digits, stacked: size of the generated training set (MNIST-sized; stacked.yaml: 128k)
    seed: int = 0  # digits, stacked: generation seed, apart from trainer.seed so every run sees the same data
    limit: int = 0  # train on the first N images of the training split only (debug=overfit); 0 = all

    def check(self) -> None:
        self._check(self.image_size in (16, 32, 64, 128, 256), "image_size", "must be a power of two from 16 to 256")
        self._check(self.channels in (1, 3), "channels", "must be 1 or 3")
        self._at_least(1, "batch_size")
        self._check(self.num_workers is None or self.num_workers >= 0, "num_workers", "must be >= 0, or null for auto")
        if self.num_workers:  # a process each: thousands would exhaust the machine's memory
            self._within_cpus("num_workers", "0 to load in the main process, or null for auto")
        self._check(bool(str(self.root).strip()), "root", "is empty, which reads the launch directory: name a folder")
        # Hydra refuses other names at the command line; this catches a DataConfig built in code
        self._check(self.name in list(DatasetName), "name", f"must be one of {', '.join(DatasetName)}")
        self._check(self.source in self.SOURCES, "source", f"must be one of {', '.join(self.SOURCES)} (10-class gray)")
        stacked = self.name == "stacked"
        self._check(not stacked or self.channels == 3, "channels", "must be 3 for data=stacked: three images as RGB")
        built_in = self.name in ("digits", "folder", "packed") or (stacked and self.source == "digits")
        why = f"has nothing to fetch for data={self.name}" + (f" with data.source={self.source}" if stacked else "")
        self._check(not (self.download and built_in), "download", why)
        batch = f"data.batch_size ({self.batch_size}): an epoch needs one full batch"
        self._check(self.num_samples >= self.batch_size, "num_samples", f"must be at least {batch}")
        why = f"must be 0 (the whole training split) or at least {batch}"
        self._check(self.limit == 0 or self.limit >= self.batch_size, "limit", why)


@dataclass
class ModelConfig(_Group):
    KEY = "model."
    z_dim: int = 100  # latent size, DCGAN paper
    g_width: int = 32  # G's channels at full resolution (ngf) (docs/results.md#quality-in-one-minute)
    d_width: int = 32  # D's channels at full resolution (ndf)
    ema_decay: float = 0.999  # EMA of G's weights for sampling (Karras et al. 2018), warmed up; 0 = off
    ema_kimg: float = 0.0  # > 0: EMA half-life in thousands of images (StyleGAN2-ADA's ema_kimg), replaces ema_decay
    ema_rampup: float = 0.05  # ema_kimg's half-life is at most this x the images seen so far; 0 = no ramp
    ema_every: int = 1  # steps between EMA updates, each with the decay of that many steps (same half-life)
    sync_batchnorm: bool = False  # DDP: BatchNorm statistics over all ranks' batches (SyncBatchNorm)
    d_batchnorm: bool = False  # BatchNorm in D, as DCGAN (experiment=paper); per-sample penalties need it off
    spectral_norm: bool = True  # on D's convolutions (Miyato et al. 2018; docs/results.md#training-longer)
    pack: int = 1  # PacGAN (Lin et al. 2018): D judges `pack` samples at once, which exposes mode collapse
    minibatch_std: int = 0  # group size of ProGAN's minibatch-stddev channel in D (Karras et al. 2018); 0 = off
    conditional: bool = False  # class-conditional G(z, y) and projection D (Miyato & Koyama 2018); needs labels
    # DiffAugment (Zhao et al. 2020) on every image D sees; '[]' = none (docs/results.md#training-longer)
    diffaugment: List[DiffAugmentPolicy] = field(default_factory=lambda: list(DiffAugmentPolicy))
    ada_target: float = 0.6  # adaptive DiffAugment: p steered to hold r_t = E[sign(D(x))] here (ADA); 0 = always on
    ada_kimg: float = 100.0  # thousands of images for p to move from 0 to 1 (ADA's speed)

    def check(self) -> None:
        self._at_least(1, "z_dim", "g_width", "d_width", "pack")
        self._at_least(1, "ema_every", why="must be >= 1 (1 = every step)")
        self._at_least(0, "minibatch_std", "ema_kimg", "ema_rampup")
        self._check(0 <= self.ema_decay < 1, "ema_decay", "must be in [0, 1) (0 = no EMA)")
        self._check(0 <= self.ada_target < 1, "ada_target", "must be in [0, 1) (0 = off)")
        self._check(self.ada_kimg > 0, "ada_kimg", "must be > 0")
        self._check(not (self.conditional and self.pack > 1), "pack", "must be 1 with model.conditional=true")


@dataclass
class LossConfig(_Group):
    KEY = "loss."
    name: LossName = LossName.bce  # adversarial loss: bce (non-saturating) or hinge
    feature_matching: float = 0.0  # weight of the feature-matching term (Salimans et al. 2016); 0 = off
    backward_mode: BackwardMode = BackwardMode.summed  # separate = log each G term's gradient norm
    gradient_penalty: float = 0.0  # weight of the WGAN-GP gradient penalty (paper: 10); 0 = off
    r1: float = 0.0  # gamma of the R1 penalty on real images (Mescheder et al. 2018); 0 = off
    real_label: float = 1.0  # bce only: D's target for real images; 0.9 = one-sided label smoothing

    def check(self) -> None:
        self._at_least(0, "feature_matching", "gradient_penalty", "r1", why="must be >= 0 (it weights a squared term)")
        self._check(0.5 < self.real_label <= 1, "real_label", "must be in (0.5, 1]")


@dataclass
class OptimConfig(_Group):
    KEY = "optim."
    lr: float = 1e-3  # Adam step size for G, and D unless lr_d is set (docs/results.md#quality-in-one-minute)
    lr_d: Optional[float] = None  # D's own step size (TTUR, Heusel et al. 2017); null = optim.lr
    lr_decay: float = 0.0  # linear decay to 0 over this last fraction of steps (docs/results.md#other-ideas)
    beta1: float = 0.0  # Adam's momentum: 0 for a spectrally normalised D, as SAGAN; experiment=paper: 0.5
    beta2: float = 0.999  # Adam default

    def check(self) -> None:
        self._check(self.lr > 0, "lr", "must be > 0")
        self._check(self.lr_d is None or self.lr_d > 0, "lr_d", "must be > 0 (or null)")
        self._check(0 <= self.lr_decay <= 1, "lr_decay", "must be in [0, 1] (0 = constant)")
        for key in ("beta1", "beta2"):
            self._check(0 <= getattr(self, key) < 1, key, "must be in [0, 1)")


@dataclass
class TrainerConfig(_Group):
    KEY = "trainer."
    max_steps: int = 10000  # generator updates; 10,000 x 64 images is about 11 epochs of digits
    device: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps
    seed: int = 0  # seeds weights, latents and shuffling
    resume: Optional[str] = None  # a checkpoint file or a run directory to continue from
    precision: Precision = Precision.auto  # auto | fp32 | bf16 | fp16 (docs/speed.md)
    channels_last: bool = True  # NHWC memory format: faster convolutions on CPU (oneDNN) and tensor cores
    compile: bool = False  # torch.compile G and D (not the whole step); compile time is logged apart
    threads: int = 0  # torch intra-op threads; 0 = torch's default (a thread per core); fixed, and kept on resume
    adapt_threads: bool = False  # follow free cores (gan/training/threads.py): oneDNN's sums vary, not bit-exact
    retain_host_memory: bool = True  # CPU: glibc malloc keeps freed memory (gan/device.py:retain_freed_memory)
    log_every: int = 50  # steps between scalar logs (the only host syncs of the loop)
    sample_every: int = 500  # steps between fixed-noise sample grids (20 in a default run)
    checkpoint_every: int = 1000  # steps between writes of checkpoints/last.pt (and one at the end)
    keep_checkpoints: int = 0  # also keep the last K numbered checkpoints (step_000500.pt, ...); 0 = none
    on_nan: OnNonFinite = OnNonFinite.stop  # what a NaN/inf loss does: stop | skip
    on_d_won: OnDWon = OnDWon.warn  # when D has won over d_won_window steps: off | warn | stop
    d_won_window: int = 1000  # steps the D-won alarm reads (gan/training/loop.py)
    deterministic: bool = False  # bit-reproducible kernels on GPU (slower); CPU runs are already exact
    num_fixed_samples: int = 64  # images in the fixed-noise grid (an 8 x 8 grid; conditional: 8 per class row)
    overfit_every: int = 500  # steps between D's scores on train and held-out reals (gan/training/loop.py); 0 = off
    progress: bool = True  # show a tqdm progress bar on the terminal
    final_eval_samples: int = 0  # after training, evaluate.py on this many samples; train.py returns the FID; 0 = skip
    eval_every: int = 0  # steps between FID measurements of the EMA generator (gan/training/loop.py); 0 = off
    eval_samples: int = 2000  # samples per in-training measurement; compare FID curves of equal N only

    def check(self) -> None:
        self._at_least(1, "max_steps", "log_every", "sample_every", "checkpoint_every", "num_fixed_samples")
        self._at_least(0, "threads", "keep_checkpoints", "overfit_every", "final_eval_samples", "eval_every")
        why = "is empty (an unset shell variable?): name a checkpoint or run folder, or auto; omit it for a new run"
        self._check(self.resume is None or bool(self.resume.strip()), "resume", why)
        self._within_cpus("threads", "0 for torch's default")
        self._check(not (self.adapt_threads and self.threads), "adapt_threads", "and trainer.threads: set one of them")
        self._at_least(10, "eval_samples", why="must be at least 10 (FID needs a covariance, k + 1 neighbours)")
        why = f"must be at least trainer.log_every ({self.log_every}): the alarm reads D's outputs at the log points"
        ok = self.d_won_window >= self.log_every or self.on_d_won == OnDWon.off  # off: no window is read
        self._check(ok, "d_won_window", why + " of the window (or trainer.on_d_won=off)")
        check_device_name(self.device, "trainer.device")


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def check(self) -> None:
        require_finite(self)  # first: a nan passes no range check's wording honestly ('must be > 0')
        for group in fields(self):
            getattr(self, group.name).check()
        model, batch_size = self.model, self.data.batch_size
        model._check(batch_size % model.pack == 0, "pack", f"must divide data.batch_size ({batch_size})")
        group, per_pack = model.minibatch_std, batch_size // model.pack  # MinibatchStd would shrink it to the gcd
        if group and per_pack % group:
            seen = f"data.batch_size={batch_size}" + (f" / model.pack={model.pack}" if model.pack > 1 else "")
            shrunk = math.gcd(per_pack, group)
            effect = "groups of 1 sample, a constant channel (no signal)" if shrunk == 1 else f"groups of {shrunk}"
            divisor = max(d for d in range(1, min(group, per_pack) + 1) if per_pack % d == 0)
            why = f"must divide the {per_pack} samples D judges at once ({seen}): it would shrink to {effect}. Use a "
            model._check(False, "minibatch_std", why + f"divisor of {per_pack} such as {divisor}, or 0 to turn it off")
        why = "must be false with loss.gradient_penalty or loss.r1: BatchNorm makes a sample's penalty depend on the "
        why += "batch. Add model.d_batchnorm=false, or use experiment=wgan_gp (no BatchNorm in D, Adam betas (0, 0.9))"
        model._check(not (model.d_batchnorm and (self.loss.gradient_penalty or self.loss.r1)), "d_batchnorm", why)


def require_finite(config: Any, prefix: str = "") -> None:
    """Hydra reads nan, inf and 1e400 as floats (`lr_d > 0` lets inf through) and ints of any size (torch: 64 bits)."""
    for spec in fields(config):
        value, key = getattr(config, spec.name), f"{prefix}{spec.name}"
        if is_dataclass(value):
            require_finite(value, f"{key}.")
        elif isinstance(value, float):  # no setting can use nan or inf
            _require(math.isfinite(value), key, value, "must be a finite number: choose one")
        elif isinstance(value, int):
            _require(-(2**63) <= value < 2**63, key, value, "does not fit in torch's 64 bits: choose a smaller number")


def check_device_name(name: str, key: str) -> None:  # the spelling only: gan.device says if this machine has it
    _require(bool(re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", name)), key, name, "must be auto, cpu, cuda, cuda:N or mps")


def _require(ok: bool, key: str, value: Any, why: str) -> None:
    if not ok:
        shown = value.value if isinstance(value, Enum) else value  # 'mnist', not <DatasetName.mnist: 'mnist'>
        raise ConfigError(f"{key}={shown!r} {why}.")


def require_known(cfg: DictConfig, schema: Any, prefix: str = "") -> None:
    """A setting added with `+key=value` is kept by Hydra and dropped by OmegaConf.to_object: nothing would read it."""
    known = {spec.name: spec.type for spec in fields(schema)}
    for key in cfg:
        why = "nothing would read it. Remove it; `--cfg job` prints every setting there is"
        if key not in known:
            raise ConfigError(f"{prefix}{key} is not a setting (added with +{prefix}{key}=...?): {why}.")
        if isinstance(cfg._get_node(key), DictConfig) and is_dataclass(known[key]):
            require_known(cfg[key], known[key], f"{prefix}{key}.")


def validate(cfg: DictConfig, schema: type = TrainConfig) -> Any:
    """The typed config (TrainConfig's ranges: checked by gan.training.train, the one way every run trains)."""
    require_known(cfg, schema)
    return OmegaConf.to_object(cfg)


def to_plain(cfg: TrainConfig | DictConfig) -> dict:  # (structured: a DictConfig's copy)
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)


def run_suffix(overrides: Sequence[str], exclude: Sequence[str] = (), limit: int = 120) -> str:
    """`_loss-hinge+optim.lr-2e-4`: characters `trainer.resume=` takes unquoted, whole overrides up to `limit`."""
    items = []
    for override in sorted(overrides, key=lambda o: o.lstrip("+~")):
        key, equals, value = override.lstrip("+~").partition("=")
        if not equals or key.startswith("hydra.") or key in exclude:
            continue
        value = value.strip("'\"").strip("[]").replace(",", "-").replace("/", "-")
        items.append(f"{key}-{re.sub(r'[^A-Za-z0-9._+@%-]', '_', value)}")
    name = items[0][:limit] if items else ""  # one override longer than the limit alone is cut in its value
    for item in items[1:]:  # whole overrides only: a name cut mid-key reads as another setting
        if len(name) + 1 + len(item) > limit:
            break
        name = f"{name}+{item}"
    return f"_{name}" if name else ""


class FeatureSpace(str, Enum):
    classifier = "classifier"  # penultimate layer of a small CNN trained on the dataset's labels; offline
    inception = "inception"  # Inception-v3 pool3 (2048-d), the published FID (docs/evaluation.md)


class SaveSamples(str, Enum):
    none = "none"
    npz = "npz"  # samples.npz, key `arr_0`: uint8 (N, H, W, C), as metric tools read it
    png = "png"  # samples/000000.png, ...: one file per sample


class ExportFormat(str, Enum):
    none = "none"
    torchscript = "torchscript"  # generator.torchscript.pt (torch.jit.script: keeps control flow)
    export = "export"  # generator.pt2 (torch.export: one graph with a dynamic batch dimension)
    both = "both"


@dataclass
class ClassifierConfig(_Group):
    KEY = "metrics.classifier."
    width: int = 16  # channels of the first conv block (doubled twice); 16 reaches 99%+ on digits in one epoch
    feature_dim: int = 128  # size of the penultimate layer, the feature space of FID/KID/P/R
    epochs: int = 1  # passes over the training split; one is enough on digits and MNIST (about 40 s at 32 px)
    batch_size: int = 128
    lr: float = 3e-3  # peak of the one-cycle schedule (Smith & Topin 2018): converges in one epoch
    train_images: int = 0  # cap on the training images used; 0 = the whole training split
    seed: int = 0  # initial weights and shuffling
    min_accuracy: float = 0.97  # refuse to measure with a classifier below this test accuracy (not in the cache key)

    def check(self) -> None:
        self._at_least(1, "width", "feature_dim", "epochs", "batch_size")
        self._check(self.lr > 0, "lr", "must be > 0")
        self._check(self.train_images >= 0, "train_images", "must be >= 0 (0 = the whole training split)")
        self._check(0 <= self.min_accuracy <= 1, "min_accuracy", "must be in [0, 1]")


@dataclass
class MetricsConfig(_Group):
    KEY = "metrics."
    features: FeatureSpace = FeatureSpace.classifier  # feature space of FID, KID, precision/recall, density/coverage
    inception_weights: Optional[str] = None  # features=inception: torch-fidelity's state dict (docs/evaluation.md)
    feature_network: Optional[str] = None  # features=inception: NVlabs' TorchScript inception-2015-12-05.pt
    kid_subsets: int = 100  # KID averages the MMD over this many random subsets (Binkowski et al. 2018)
    kid_subset_size: int = 1000  # images per KID subset; clipped to the number of samples
    pr_k: int = 3  # neighbours for improved precision/recall (Kynkaanniemi et al. 2019: k = 3)
    dc_k: int = 5  # neighbours for density/coverage (Naeem et al. 2020: k = 5)
    class_threshold: float = 0.01  # a class counts as covered when it holds at least this share of the samples
    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)

    def check(self) -> None:
        self._at_least(1, "kid_subsets", "kid_subset_size", "pr_k", "dc_k")
        self._check(0 < self.class_threshold < 1, "class_threshold", "must be in (0, 1)")
        for key in ("inception_weights", "feature_network"):
            ok = getattr(self, key) is None or self.features == FeatureSpace.inception
            self._check(ok, key, "is an Inception-v3 file: add metrics.features=inception")
        why = f"and metrics.inception_weights={self.inception_weights!r} are one network in two formats: give one"
        self._check(self.inception_weights is None or self.feature_network is None, "feature_network", why)
        self.classifier.check()


@dataclass
class EvaluateConfig(_Group):
    checkpoint: str = "???"  # required: a checkpoint file, or a training run directory (its checkpoints/last.pt)
    data: DataConfig = field(default_factory=DataConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    num_samples: int = 10000  # samples measured; FID is biased upward at small N, so compare equal N only
    batch_size: int = 500  # images per batch through G and the feature network
    use_ema: bool = True  # sample from the EMA generator when the checkpoint has one
    bn_batches: int = 20  # batches to recompute G's BatchNorm statistics from (update_bn); 0 = keep the checkpoint's
    seed: int = 0  # latents of the measured samples, the grids and the KID subsets
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps, as trainer.device
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    save_samples: SaveSamples = SaveSamples.none  # also write the measured samples: none | npz | png
    export: ExportFormat = ExportFormat.none  # also write the generator: none | torchscript | export | both
    grid_samples: int = 64  # images in samples.png (an 8 x 8 grid)
    interpolation_rows: int = 8  # latent pairs in interpolation.png, one row each
    interpolation_steps: int = 10  # images per row, both ends included
    neighbour_queries: int = 8  # samples in nearest_neighbours.png, one row each
    neighbours: int = 5  # nearest training images shown right of each sample
    class_id: Optional[int] = None  # conditional: sample and measure this class alone; null = all (docs/conditional.md)

    def check(self) -> None:
        require_finite(self)
        self._check(self.class_id is None or self.class_id >= 0, "class_id", "must be >= 0 (a class number)")
        k, which = max((self.metrics.pr_k, "metrics.pr_k"), (self.metrics.dc_k, "metrics.dc_k"))
        why = f"must exceed {which} ({k}): each sample needs k neighbours among the others, or lower {which}"
        self._check(self.num_samples > k, "num_samples", why)
        self._at_least(1, "batch_size", "grid_samples", "interpolation_rows", "neighbour_queries", "neighbours")
        self._at_least(2, "interpolation_steps", why="must be at least 2 (both ends)")
        self._at_least(0, "threads", "bn_batches")
        self._within_cpus("threads", "0 for torch's default")
        check_device_name(self.device, "device")
        self.metrics.check()


@dataclass
class GenerateConfig(_Group):
    checkpoint: str = "???"  # required: a checkpoint file, or a training run directory (its checkpoints/last.pt)
    num: int = 64  # images written, as PNGs and in samples.npz
    out: str = "outputs/generate/${now:%Y-%m-%d}/${now:%H-%M-%S}"  # where (Hydra's job folder: hydra.run.dir follows)
    class_id: Optional[int] = None  # conditional: this class alone; null = classes 0, 1, 2, ... in turn
    seed: int = 0  # the latents drawn: the same seed gives the same images
    use_ema: bool = True  # the EMA generator when the checkpoint has one, else G itself
    batch_size: int = 500  # images per batch through G
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps, as trainer.device

    def check(self) -> None:
        self._at_least(1, "num", "batch_size")
        self._check(self.class_id is None or self.class_id >= 0, "class_id", "must be >= 0 (a class number)")
        check_device_name(self.device, "device")


def validate_and_check(cfg: DictConfig, schema: type = EvaluateConfig) -> Any:
    """validate(), then the schema's checks: evaluate.py's, generate.py's, and gan.api's for all three."""
    if OmegaConf.is_missing(cfg, "checkpoint"):
        raise ConfigError("checkpoint=PATH is required: a checkpoint file (checkpoints/last.pt) or its run's folder.")
    typed = validate(cfg, schema)
    typed.check()
    return typed


# Filled on import, as in Hydra's structured-config tutorial: configs/NAME.yaml's defaults name NAME_schema
for name, schema in (("train", TrainConfig), ("evaluate", EvaluateConfig), ("generate", GenerateConfig)):
    ConfigStore.instance().store(name=f"{name}_schema", node=schema)
if not OmegaConf.has_resolver("run_suffix"):  # configs/train.yaml: the run folder's name
    OmegaConf.register_new_resolver("run_suffix", run_suffix)
