"""FID, KID, precision/recall, density/coverage, class/mode coverage of uint8 images (classifier or Inception space)."""

import dataclasses
import hashlib
import importlib.util
import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.image.fid import FrechetInceptionDistance
from torchmetrics.image.kid import KernelInceptionDistance
from torchvision.transforms.functional import gaussian_blur

from gan.checkpoint import describe, save_checkpoint
from gan.config import ClassifierConfig, DataConfig, DatasetName, FeatureSpace, MetricsConfig
from gan.core.sampling import eval_mode
from gan.data import ImageSet, load_dataset, to_unit_range
from gan.data.sources import CLASSIFIER_CACHE, PACK_FILE, list_images
from gan.errors import MetricsError

log = logging.getLogger(__name__)

CLASSIFIER_VERSION = 1  # part of the cache key: bump when Classifier or train_classifier changes
GENERATED_IMAGES = 10_000  # generated digits at least (data.num_samples): 99.9% held-out at 16 px in one epoch
_LOADING_KEYS = ("root", "download", "in_memory", "batch_size", "num_workers", "limit")  # not in the cache key
INCEPTION_SHA256_PREFIX = "6726825d"  # torch.hub names a file NAME-<its sha256's first hex digits>.EXT
INCEPTION_FILE = f"weights-inception-2015-12-05-{INCEPTION_SHA256_PREFIX}.pth"
INCEPTION_WEIGHTS_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{INCEPTION_FILE}"
NVLABS_URL = "https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/inception-2015-12-05.pt"
INCEPTION_DIMS = 2048  # pool3, the layer of the published FID (Heusel et al. 2017)
KID_KERNELS = {  # metrics.json's kid_kernel, in each feature space
    FeatureSpace.inception: "(x.y / d + 1)^3, the published KID's (Binkowski et al. 2018)",
    FeatureSpace.classifier: "(x.y / E|f_real|^2 + 1)^3, scale-free: comparable only within this classifier",
}
FEATURE_METRICS = ("fid", "kid_mean", "kid_std", "precision", "recall", "density", "coverage")


class Classifier(nn.Module):
    """uint8 images -> class logits; `features` (the layer before) is the feature space of FID/KID/P/R."""

    def __init__(self, channels: int, num_classes: int, width: int = 16, feature_dim: int = 128):
        super().__init__()
        self.architecture = dict(channels=channels, num_classes=num_classes, width=width, feature_dim=feature_dim)
        layers: list[nn.Module] = []
        for cin, cout in [(channels, width), (width, 2 * width), (2 * width, 4 * width)]:
            layers += [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True), nn.MaxPool2d(2)]
        layers += [nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16 * width, feature_dim), nn.ReLU(True)]
        self.trunk = nn.Sequential(*layers)
        self.head = nn.Linear(feature_dim, num_classes)

    def features(self, images: Tensor) -> Tensor:
        return self.trunk(to_unit_range(images))  # the same [-1, 1] scaling G's data gets

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.features(images))


def train_classifier(
    train: ImageSet, test: ImageSet, cfg: ClassifierConfig, device: torch.device
) -> tuple[Classifier, float]:
    """The model and its accuracy on `test`; a one-cycle schedule (Smith & Topin 2018) converges in one epoch."""
    images, labels = train.images[: cfg.train_images or None], train.labels[: cfg.train_images or None]
    with torch.random.fork_rng(devices=[]):  # a fixed init that leaves the caller's random stream alone
        torch.manual_seed(cfg.seed)
        model = Classifier(images.size(1), train.num_classes, cfg.width, cfg.feature_dim).to(device)
    batches = max(images.size(0) // cfg.batch_size, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, cfg.lr, total_steps=cfg.epochs * batches)
    order = torch.Generator().manual_seed(cfg.seed)
    for _ in range(cfg.epochs):
        for index in torch.randperm(images.size(0), generator=order)[: batches * cfg.batch_size].split(cfg.batch_size):
            loss = F.cross_entropy(model(images[index].to(device)), labels[index].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    predicted = predict(model, test.images, cfg.batch_size * 4, device)
    return model, float((predicted == test.labels).float().mean())


def classifier_key(data: DataConfig, cfg: ClassifierConfig) -> str:
    """A file name that changes whenever the images or the classifier's training would change."""
    identity = {
        "version": CLASSIFIER_VERSION,
        "data": {k: v for k, v in dataclasses.asdict(data).items() if k not in _LOADING_KEYS},
        "classifier": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "min_accuracy"},
    }
    root = Path(data.root).expanduser()
    if data.name == DatasetName.folder and root.is_dir():  # a folder's images are its files, not its settings
        paths, _, num_classes = list_images(root)
        identity["folder"] = {"images": len(paths), "classes": num_classes}  # one added: another classifier
    if data.name == DatasetName.packed and (root / PACK_FILE).is_file():  # packed again: another classifier
        identity["pack"] = (root / PACK_FILE).stat().st_mtime_ns
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{data.name}-{data.image_size}px-{data.channels}ch-{digest}"


def load_or_train_classifier(
    data: DataConfig, cfg: ClassifierConfig, device: torch.device
) -> tuple[Classifier, float, Path]:
    """The cached classifier, or a new one trained and cached; MetricsError below cfg.min_accuracy."""
    # the whole training split, whatever subset G trained on; of generated digits at least GENERATED_IMAGES
    data = dataclasses.replace(data, limit=0, num_samples=max(data.num_samples, GENERATED_IMAGES))
    path = Path(data.root).expanduser() / CLASSIFIER_CACHE / f"{classifier_key(data, cfg)}.pt"
    model = None
    if path.is_file():
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            model, accuracy = Classifier(**state["architecture"]), float(state["accuracy"])
            model.load_state_dict(state["weights"])
            log.info("Metrics classifier: %s (%.2f%% test accuracy)", path, 100 * accuracy)
        except Exception as err:  # a damaged or foreign file: train a new one over it
            log.warning("Ignoring the cached classifier %s (%s); training a new one.", path, describe(err))
            model = None
    if model is None:  # trained outside the except clause: its errors are not "during handling" of this one
        started = time.perf_counter()
        train, test = (load_dataset(data, train=split, in_memory=True) for split in (True, False))
        if train.num_classes < 2:
            why = "classifier features need 2 or more. Use metrics.features=inception"
            raise MetricsError(f"data={data.name} has {train.num_classes} class: {why}.")
        model, accuracy = train_classifier(train, test, cfg, device)
        log.info(f"Trained the metrics classifier in {time.perf_counter() - started:.1f} s: {100 * accuracy:.2f}% "
                 f"test accuracy on {test.labels.numel()} held-out images")  # fmt: skip
        # enums as their values: the file must load with weights_only=True
        plain = [{k: getattr(v, "value", v) for k, v in dataclasses.asdict(c).items()} for c in (data, cfg)]
        state = dict(weights=model.state_dict(), accuracy=accuracy, architecture=model.architecture,
                     data=plain[0], classifier=plain[1])  # fmt: skip
        try:
            save_checkpoint(state, path)
        except OSError as err:  # a read-only data folder: measure anyway, train again next time
            log.warning("Could not cache the classifier in %s (%s); it will be trained again next time.", path, err)
    if accuracy < cfg.min_accuracy:
        todo = "Raise metrics.classifier.epochs or .width, or lower .min_accuracy"
        what = f"{100 * accuracy:.2f}% test accuracy, below metrics.classifier.min_accuracy={cfg.min_accuracy}"
        raise MetricsError(f"The metrics classifier ({path}) reaches {what}. {todo}.")
    return model.to(device).eval(), accuracy, path


class ClassifierFeatures(nn.Module):
    """per_channel: each channel classified as a grayscale image (Stacked-MNIST), features concatenated."""

    def __init__(self, classifier: Classifier, per_channel: bool = False, channels: int = 1):
        super().__init__()
        self.classifier, self.per_channel = classifier.eval(), per_channel
        self.num_features = classifier.head.in_features * (channels if per_channel else 1)

    def forward(self, images: Tensor) -> Tensor:
        flat = images.reshape(-1, 1, *images.shape[-2:]) if self.per_channel else images
        return self.classifier.features(flat).view(images.size(0), -1)


class Inception(nn.Module):
    """Inception-v3 pool3: torch-fidelity's with TF1 resize (Parmar 2022: another moves FID) or NVlabs' TorchScript."""

    def __init__(self, net: nn.Module, file: Path, network: str, resizer: str, torchscript: bool = False, **space: Any):
        super().__init__()
        self.net, self.torchscript, self.num_features = net, torchscript, INCEPTION_DIMS
        self.feature_space = {
            "network": f"Inception-v3 pool3, {network}", "file": str(file), **space, "dims": INCEPTION_DIMS,
            "input": "uint8 RGB at data.image_size (grayscale repeated to 3 channels)",
            "resizer": f"inside the network: {resizer}",
        }  # fmt: skip

    def forward(self, images: Tensor) -> Tensor:
        rgb = images.repeat(1, 3, 1, 1) if images.size(1) == 1 else images  # as StyleGAN2-ADA, compare_gan feed MNIST
        return self.net(rgb, return_features=True) if self.torchscript else self.net(rgb)[0]


def inception_network(cfg: MetricsConfig) -> Inception:
    """Each piece is checked first, so that a missing one fails with what to do; no weights file: downloaded."""
    if cfg.feature_network is not None:  # NVlabs' TorchScript file
        file, net = existing_file(cfg.feature_network, "metrics.feature_network", NVLABS_URL), None
        call, key = "net(uint8 images of shape (2, 3, 32, 32), return_features=True)", "metrics.feature_network"
        hint = f"It takes NVlabs' {NVLABS_URL}; a state dict goes in metrics.inception_weights."
        try:
            with warnings.catch_warnings():  # torch 2.x deprecates TorchScript (FutureWarning); NVlabs' file is one
                warnings.simplefilter("ignore", FutureWarning)
                net = torch.jit.load(str(file), map_location="cpu").eval()
            with torch.inference_mode():
                out = net(torch.zeros(2, 3, 32, 32, dtype=torch.uint8), return_features=True)
        except Exception as err:  # not TorchScript: torch.jit.load's RuntimeError; else another signature or input
            problem = f"loads, but {call} fails" if net is not None else "is not a TorchScript file"
            raise MetricsError(f"{key}={file} {problem} ({describe(err)}). {hint}") from err
        if not (isinstance(out, Tensor) and out.is_floating_point() and tuple(out.shape) == (2, INCEPTION_DIMS)):
            got = f"a {out.dtype} tensor of shape {tuple(out.shape)}" if isinstance(out, Tensor) else type(out).__name__
            raise MetricsError(f"{key}={file}: {call} returns {got}, not float features (2, {INCEPTION_DIMS}). {hint}")
        resizer = "the TorchScript file's own resize to 299 x 299 (clean-fid's legacy_tensorflow mode)"
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        return Inception(net, file, "NVlabs' TorchScript file", resizer, torchscript=True, sha256=digest)
    weights = cfg.inception_weights
    file = existing_file(weights, "metrics.inception_weights", INCEPTION_WEIGHTS_URL) if weights else None
    if importlib.util.find_spec("torch_fidelity") is None:
        todo = "(the metrics extra), or give NVlabs' TorchScript file as metrics.feature_network=PATH"
        raise MetricsError(f"metrics.features=inception needs torch-fidelity: `pip install torch-fidelity` {todo}.")
    if file is not None:  # refused unless a state dict: torch-fidelity loads it with weights_only=False (runs code)
        unreadable = f"metrics.inception_weights={weights} cannot be read as a state dict of tensors"
        hint = f"It takes torch-fidelity's {INCEPTION_WEIGHTS_URL}."
        try:
            with warnings.catch_warnings():  # torch.load warns of a TorchScript archive before refusing it; we say so
                warnings.simplefilter("ignore", UserWarning)
                state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as err:  # not a torch file, a pickle with code, a TorchScript archive
            if "torchscript" in str(err).lower():
                hint = "It is a TorchScript file: pass it as metrics.feature_network instead."
            raise MetricsError(f"{unreadable} ({describe(err)}). {hint}") from err
        if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
            raise MetricsError(f"{unreadable} (holds a {type(state).__name__}). {hint}")
    try:
        from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

        net = FeatureExtractorInceptionV3(
            "inception-v3-compat", [str(INCEPTION_DIMS)], feature_extractor_weights_path=str(file) if file else None
        )
    except Exception as err:  # offline: URLError; a wrong file: load_state_dict's RuntimeError (keys, shapes)
        said = f"metrics.inception_weights={weights} is a state dict, but not of torch-fidelity's Inception-v3"
        todo = f"It takes {INCEPTION_WEIGHTS_URL}."
        if file is None:
            said = "Could not download torch-fidelity's Inception-v3 weights"
            todo = f"Offline, download {INCEPTION_WEIGHTS_URL} elsewhere and pass metrics.inception_weights=PATH."
        raise MetricsError(f"{said} ({describe(err)}). {todo}") from err
    file = file or Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_FILE  # downloaded
    digest = hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else None
    published = digest is not None and digest.startswith(INCEPTION_SHA256_PREFIX)
    if digest is not None and not published:
        log.warning(f"{file}: its sha256 begins {digest[:8]}, not {INCEPTION_SHA256_PREFIX} as the published FID "
                    "weights' does: the metrics are not comparable with published FIDs.")  # fmt: skip
    network, resizer = "torch-fidelity's FeatureExtractorInceptionV3", "torch-fidelity's interpolate_bilinear_2d_like_"
    resizer += "tensorflow1x to 299 x 299 (TF1 resize_bilinear, as the TTUR FID)"
    return Inception(net, file, network, resizer, sha256=digest, published_weights=published)


def existing_file(path: str, key: str, url: str) -> Path:
    file = Path(path).expanduser()
    if not file.is_file():
        raise MetricsError(f"{key}={path}: no such file. Download {url} on a machine with internet and pass its path.")
    return file


@torch.inference_mode()
def batched(net: nn.Module, images: Tensor, batch_size: int, device: torch.device) -> Tensor:
    return torch.cat([net(chunk.to(device)).float().cpu() for chunk in images.split(batch_size)])


def predict(
    classifier: Classifier, images: Tensor, batch_size: int, device: torch.device, per_channel: bool = False
) -> Tensor:
    """per_channel: one digit per channel, read as 100 a + 10 b + c."""
    with eval_mode(classifier):
        flat = images.reshape(-1, 1, *images.shape[-2:]) if per_channel else images
        digits = batched(classifier, flat, batch_size, device).argmax(dim=1).view(images.size(0), -1)
    return (digits * 10 ** torch.arange(digits.size(1) - 1, -1, -1)).sum(dim=1)  # most significant channel first


def fid(real: Tensor, fake: Tensor) -> float:
    """Heusel et al. 2017. Biased upward at small N (Chong & Forsyth 2020): compare only equal N."""
    smallest, dims = min(real.size(0), fake.size(0)), real.size(1)
    if smallest <= dims:
        singular = f"FID from {smallest} images of {dims} features: the covariances are singular (rank < {dims})"
        bias = "the number is biased upward, comparable only with FIDs from as many images (published: 10k or 50k)"
        log.warning(f"{singular}; {bias}.")
    identity = nn.Identity()  # as torchmetrics' extractor: the features are computed once, shared by all metrics
    identity.num_features = real.size(1)
    metric = FrechetInceptionDistance(feature=identity)
    metric.update(real, real=True)
    metric.update(fake, real=False)
    return float(metric.compute())


def kid(
    real: Tensor, fake: Tensor, subsets: int, subset_size: int, seed: int = 0, gamma: Optional[float] = None
) -> tuple[float, float]:
    """Binkowski et al. 2018, kernel (gamma x.y + 1)^3; gamma=None: 1 / E|f_real|^2 (1/d explodes on ReLU features)."""
    gamma = gamma or 1.0 / float(real.double().square().sum(dim=1).mean())
    size = min(subset_size, real.size(0), fake.size(0))
    with warnings.catch_warnings():  # "KID will save all extracted features in buffer": intended here
        warnings.simplefilter("ignore", UserWarning)
        metric = KernelInceptionDistance(feature=nn.Identity(), subsets=subsets, subset_size=size, gamma=gamma)
    metric.update(real.double(), real=True)  # float64: the MMD is a small difference of large sums
    metric.update(fake.double(), real=False)
    with torch.random.fork_rng(devices=[]):  # subsets drawn with torch.randperm: seeded, caller untouched
        torch.manual_seed(seed)
        mean, std = metric.compute()
    # subsets as large as both sets are all the same draw: their spread is rounding (8e-16), reported as 0
    return float(mean), 0.0 if size == real.size(0) == fake.size(0) else float(std)


def precision_recall_density_coverage(
    real: Tensor, fake: Tensor, pr_k: int = 3, dc_k: int = 5, chunk: int = 1024
) -> dict[str, float]:
    """Kynkaanniemi et al. 2019 and Naeem et al. 2020, strict `<` as clovaai/prdc; row chunks bound memory."""

    def radius(x: Tensor, k: int) -> Tensor:  # to the k-th neighbour: column 0 is the point itself
        return torch.cat([torch.cdist(rows, x).topk(k + 1, dim=1, largest=False).values for rows in x.split(chunk)])

    real_nearest, fake_pr = radius(real, max(pr_k, dc_k)), radius(fake, pr_k)[:, pr_k]
    real_pr, real_dc = real_nearest[:, pr_k], real_nearest[:, dc_k]
    in_real_manifold, balls_per_fake = torch.zeros(fake.size(0), dtype=torch.bool), torch.zeros(fake.size(0))
    in_fake_manifold, covered = [], []
    for start in range(0, real.size(0), chunk):
        rows = slice(start, start + chunk)
        distance = torch.cdist(real[rows], fake)  # (rows, M)
        in_real_manifold |= (distance < real_pr[rows, None]).any(dim=0)
        balls_per_fake += (distance < real_dc[rows, None]).sum(dim=0)
        in_fake_manifold.append((distance < fake_pr[None, :]).any(dim=1))
        covered.append(distance.min(dim=1).values < real_dc[rows])
    return {
        "precision": float(in_real_manifold.float().mean()),
        "recall": float(torch.cat(in_fake_manifold).float().mean()),
        "density": float(balls_per_fake.sum() / (dc_k * fake.size(0))),
        "coverage": float(torch.cat(covered).float().mean()),
    }


def distribution_metrics(real: Tensor, fake: Tensor, cfg: MetricsConfig, seed: int = 0) -> dict[str, float]:
    gamma = 1.0 / real.size(1) if cfg.features == FeatureSpace.inception else None
    kid_mean, kid_std = kid(real, fake, cfg.kid_subsets, cfg.kid_subset_size, seed, gamma)
    return {"fid": fid(real, fake), "kid_mean": kid_mean, "kid_std": kid_std,
            **precision_recall_density_coverage(real, fake, cfg.pr_k, cfg.dc_k)}  # fmt: skip


def histogram(labels: Tensor, num_classes: int) -> Tensor:
    return torch.bincount(labels, minlength=num_classes).double() / max(labels.numel(), 1)


def kl_divergence(q: Tensor, p: Tensor | float) -> float:
    """KL(q || p) in nats; 0 log 0 = 0."""
    return float(torch.xlogy(q, q / p).sum())


def class_coverage(fake: Tensor, real: Tensor, num_classes: int, threshold: float = 0.01) -> dict[str, float]:
    """Classes with >= threshold of the samples; KL(samples || data), add-one smoothed: a missing class costs log N."""
    q = histogram(fake, num_classes)
    p = (torch.bincount(real, minlength=num_classes).double() + 1) / (real.numel() + num_classes)
    return {"classes_covered": int((q >= threshold).sum()), "class_kl": kl_divergence(q, p)}


def mode_coverage(fake_modes: Tensor, num_modes: int = 1000) -> dict[str, float]:
    """Modes covered, KL to uniform (Metz et al. 2017); `digit_kl_ch{c}` tells a lopsided channel from a spread KL."""
    q = histogram(fake_modes, num_modes)
    digits = {f"digit_kl_ch{c}": kl_divergence(histogram(d, 10), 0.1) for c, d in enumerate(mode_digits(fake_modes))}
    return {"modes_covered": int((q > 0).sum()), "mode_kl": kl_divergence(q, 1.0 / num_modes), **digits}


def mode_digits(modes: Tensor) -> list[Tensor]:
    return [torch.div(modes, power, rounding_mode="floor") % 10 for power in (100, 10, 1)]


def is_stacked(dataset: ImageSet) -> bool:
    return dataset.num_classes == 1000 and dataset.images[0].size(0) == 3  # channels of one image


def with_gaussian_noise(images: Tensor, sigma: float, seed: int = 0) -> Tensor:
    """A calibration degradation (Heusel et al. 2017, fig. 1); sigma in units of the full range."""
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(seed)) * (255 * sigma)
    return (images.float() + noise).round_().clamp_(0, 255).to(torch.uint8)


def with_gaussian_blur(images: Tensor, sigma: float) -> Tensor:
    """A calibration degradation: a 3 x 3 blur of `sigma` pixels."""
    smooth = gaussian_blur(images.float(), kernel_size=[3, 3], sigma=[sigma, sigma])
    return smooth.round_().clamp_(0, 255).to(torch.uint8)


def sample_classes(reference_labels: Tensor, count: int, class_id: Optional[int], seed: int) -> Tensor:
    """`class_id` for all, or the held-out images' own labels, so FID compares the same class mix."""
    if class_id is not None:
        return torch.full((count,), class_id, dtype=torch.long)
    if count <= reference_labels.numel():
        return reference_labels[:count].clone()
    index = torch.randint(reference_labels.numel(), (count,), generator=torch.Generator().manual_seed(seed))
    return reference_labels[index]
