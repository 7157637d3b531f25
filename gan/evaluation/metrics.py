"""Sample quality, measured offline: feature networks, FID and KID (torchmetrics), improved
precision/recall, density/coverage, and class/mode coverage.

Owns the instruments and their arithmetic. Every function takes uint8 images (N, C, H, W), the
format of `gan.data`'s datasets, so real and generated images pass through the same conversion.
It leaves drawing samples, pictures and reports to `gan.evaluation`, and datasets to `gan.data`.

Two feature spaces:
- `classifier` (default, offline): the penultimate layer of a small CNN trained on the dataset's own
  labels, cached in `data.root/classifiers/`. Its numbers are comparable only with numbers from the
  same classifier (the cache key names it), never with published Inception FIDs.
- `inception`: Inception-v3's 2048-d pool features through torchmetrics, the published FID. It needs
  torch-fidelity and the weights file; both are checked before anything is built.

FID and KID come from torchmetrics (its FID takes the matrix square root through eigenvalues in
float64; nothing here re-derives it). torchmetrics has no precision/recall or density/coverage:
they are k-nearest-neighbour counts on `torch.cdist`, a few lines each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import time
import warnings
from enum import Enum
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.image.fid import FrechetInceptionDistance
from torchmetrics.image.kid import KernelInceptionDistance
from torchvision.transforms.functional import gaussian_blur

from gan.config import ClassifierConfig, DataConfig, FeatureSpace, MetricsConfig
from gan.data import ImageSet, load_dataset, to_unit_range
from gan.errors import MetricsError
from gan.training.checkpoint import save_checkpoint

log = logging.getLogger(__name__)

# Bump when Classifier or train_classifier changes: cached classifiers of older versions are then
# not found (the version is part of the cache key) and a new one is trained.
CLASSIFIER_VERSION = 1
# DataConfig keys that change how images are read, not which images, and data.limit (a training
# run's subset: the classifier always learns the whole training split): left out of the cache key.
_LOADING_KEYS = ("root", "download", "in_memory", "batch_size", "num_workers", "limit")
INCEPTION_WEIGHTS_URL = (
    "https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/weights-inception-2015-12-05-6726825d.pth"
)


# the classifier ----------------------------------------------------------------------------------


class Classifier(nn.Module):
    """uint8 images (N, C, S, S) -> class logits (N, num_classes); `features` is the layer before.

    Three conv blocks (BatchNorm, ReLU, 2x2 max-pool), pooled to 2 x 2 so any image size from 16 px
    works, then a `feature_dim` ReLU layer: its output is the feature space of FID/KID/P/R, as
    Inception's pool3 is for the published FID.
        1 x 32 x 32 -> w x 16 x 16 -> 2w x 8 x 8 -> 4w x 4 x 4 -> 4w x 2 x 2 -> feature_dim -> classes
    """

    def __init__(self, channels: int, num_classes: int, width: int = 16, feature_dim: int = 128):
        super().__init__()

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True), nn.MaxPool2d(2)]

        self.feature_dim = feature_dim
        self.trunk = nn.Sequential(
            *block(channels, width),
            *block(width, 2 * width),
            *block(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * width, feature_dim),
            nn.ReLU(True),
        )
        self.head = nn.Linear(feature_dim, num_classes)

    def features(self, images: Tensor) -> Tensor:
        return self.trunk(to_unit_range(images))  # the same [-1, 1] scaling G's data gets

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.features(images))


def train_classifier(
    train: ImageSet, test: ImageSet, cfg: ClassifierConfig, device: torch.device
) -> tuple[Classifier, float]:
    """Train on `train` (in-memory uint8 images) and return the model with its accuracy on `test`.

    Adam with a one-cycle learning rate (Smith & Topin 2018): warm up to cfg.lr, then anneal to
    almost 0, which converges in a single epoch on digit-like data.
    """
    images, labels = train.images, train.labels
    if cfg.train_images:
        images, labels = images[: cfg.train_images], labels[: cfg.train_images]
    channels = images.size(1)
    with torch.random.fork_rng(devices=[]):  # a fixed init that leaves the caller's random stream alone
        torch.manual_seed(cfg.seed)
        model = Classifier(channels, train.num_classes, cfg.width, cfg.feature_dim).to(device)
    batches_per_epoch = max(images.size(0) // cfg.batch_size, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, cfg.lr, total_steps=cfg.epochs * batches_per_epoch)
    order = torch.Generator().manual_seed(cfg.seed)
    model.train()
    for _ in range(cfg.epochs):
        permutation = torch.randperm(images.size(0), generator=order)
        for b in range(batches_per_epoch):
            index = permutation[b * cfg.batch_size : (b + 1) * cfg.batch_size]
            loss = F.cross_entropy(model(images[index].to(device)), labels[index].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    predicted = predict(model, test.images, cfg.batch_size * 4, device)
    return model, float((predicted == test.labels).float().mean())


def plain(config: object) -> dict:
    """A config dataclass as a dict of plain values (an Enum member becomes its value)."""
    return {k: v.value if isinstance(v, Enum) else v for k, v in dataclasses.asdict(config).items()}


def classifier_key(data: DataConfig, cfg: ClassifierConfig) -> str:
    """A file name that changes whenever the images or the classifier's training would change.

    Readable part first (`digits-32px-1ch`), then a hash of every setting that decides the
    images (all of DataConfig but how it is loaded) and the training (all of ClassifierConfig but
    min_accuracy, which only judges the result).
    """
    identity = {
        "version": CLASSIFIER_VERSION,
        "data": {k: v for k, v in dataclasses.asdict(data).items() if k not in _LOADING_KEYS},
        "classifier": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "min_accuracy"},
    }
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{data.name}-{data.image_size}px-{data.channels}ch-{digest}"


def load_or_train_classifier(
    data: DataConfig, cfg: ClassifierConfig, device: torch.device
) -> tuple[Classifier, float, Path]:
    """The cached classifier for this dataset and config, or a new one trained and cached.

    The file is `<data.root>/classifiers/<classifier_key>.pt`: a plain dict (weights, test
    accuracy, the settings it was trained with), written atomically by `save_checkpoint` and read
    with weights_only=True. Raises MetricsError when the accuracy is below cfg.min_accuracy.
    """
    data = dataclasses.replace(data, limit=0)  # the whole training split, whatever subset G trained on
    path = Path(data.root).expanduser() / "classifiers" / f"{classifier_key(data, cfg)}.pt"
    model, accuracy = _load_classifier(path, device)
    if model is None:
        started = time.perf_counter()
        train = load_dataset(data, train=True, in_memory=True)
        test = load_dataset(data, train=False, in_memory=True)
        if train.num_classes < 2:
            raise MetricsError(
                f"data={data.name} has {train.num_classes} class: the classifier feature space needs "
                "labelled data with at least 2 classes. Use metrics.features=inception instead."
            )
        model, accuracy = train_classifier(train, test, cfg, device)
        log.info(
            "Trained the metrics classifier in %.1f s: %.2f%% test accuracy on %d held-out images",
            time.perf_counter() - started,
            100 * accuracy,
            test.labels.numel(),
        )
        state = {
            "weights": model.state_dict(),
            "accuracy": accuracy,
            "architecture": {
                "channels": train.images.size(1),
                "num_classes": train.num_classes,
                "width": cfg.width,
                "feature_dim": cfg.feature_dim,
            },
            "data": plain(data),  # enums as their values: the file must load with weights_only=True
            "classifier": plain(cfg),
        }
        try:
            save_checkpoint(state, path)
            log.info("Cached it as %s", path)
        except OSError as err:  # a read-only data folder: measure anyway, train again next time
            log.warning("Could not cache the classifier in %s (%s); it will be trained again next time.", path, err)
    if accuracy < cfg.min_accuracy:
        raise MetricsError(
            f"The metrics classifier ({path}) reaches only {100 * accuracy:.2f}% test accuracy, below "
            f"metrics.classifier.min_accuracy={cfg.min_accuracy}: its features and class histogram would "
            "be unreliable. Train it longer (metrics.classifier.epochs=N) or wider "
            "(metrics.classifier.width=N), or accept it by lowering metrics.classifier.min_accuracy."
        )
    return model, accuracy, path


def _load_classifier(path: Path, device: torch.device) -> tuple[Optional[Classifier], float]:
    if not path.is_file():
        return None, 0.0
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model = Classifier(**state["architecture"])
        model.load_state_dict(state["weights"])
    except Exception as err:  # damaged or foreign file: train a new one over it
        log.warning("Ignoring the cached classifier %s (%s: %s); training a new one.", path, type(err).__name__, err)
        return None, 0.0
    log.info("Metrics classifier: %s (%.2f%% test accuracy)", path, 100 * state["accuracy"])
    return model.to(device).eval(), float(state["accuracy"])


# feature networks: uint8 images (N, C, H, W) -> features (N, num_features) ----------------------


class ClassifierFeatures(nn.Module):
    """The classifier's penultimate layer. per_channel: a C-channel image is C grayscale images
    (Stacked-MNIST), classified one by one; their features are concatenated (C * feature_dim)."""

    def __init__(self, classifier: Classifier, per_channel: bool = False, channels: int = 1):
        super().__init__()
        self.classifier, self.per_channel = classifier.eval(), per_channel
        self.num_features = classifier.feature_dim * (channels if per_channel else 1)

    def forward(self, images: Tensor) -> Tensor:
        if not self.per_channel:
            return self.classifier.features(images)
        return self.classifier.features(split_channels(images)).view(images.size(0), -1)


class InceptionFeatures(nn.Module):
    """Inception-v3 pool3 (2048-d), the network of the published FID (Heusel et al. 2017), through
    torchmetrics' copy of torch-fidelity's port. It takes uint8 and resizes to 299 x 299 itself;
    grayscale is repeated to RGB."""

    num_features = 2048

    def __init__(self, weights: Optional[str]):
        super().__init__()
        from torchmetrics.image.fid import NoTrainInceptionV3  # needs torch-fidelity, checked first

        self.net = NoTrainInceptionV3(
            name="inception-v3-compat", features_list=[str(self.num_features)], feature_extractor_weights_path=weights
        )

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images.expand(-1, 3, -1, -1) if images.size(1) == 1 else images)


def inception_features(weights: Optional[str]) -> InceptionFeatures:
    """Inception features, after checking the weights path and the package (in that order) so a
    missing piece fails here, with what to do, not deep inside a download or an import."""
    if weights is not None and not Path(weights).expanduser().is_file():
        raise MetricsError(
            f"metrics.inception_weights={weights}: no such file. Download "
            f"{INCEPTION_WEIGHTS_URL} on a machine with internet and pass its path."
        )
    if importlib.util.find_spec("torch_fidelity") is None:
        raise MetricsError(
            "metrics.features=inception needs torch-fidelity (`pip install torch-fidelity`), whose "
            "Inception-v3 port torchmetrics uses. It is not a default dependency: once installed, "
            "torchmetrics imports it at start-up. Offline it also needs the weights: download "
            f"{INCEPTION_WEIGHTS_URL} elsewhere and pass metrics.inception_weights=PATH. Or use the "
            "default metrics.features=classifier."
        )
    try:
        return InceptionFeatures(str(Path(weights).expanduser()) if weights else None)
    except Exception as err:  # offline: URLError; a wrong file: a state-dict or unpickling error
        how = (
            "is it the torch-fidelity Inception file?"
            if weights
            else f"without internet, download {INCEPTION_WEIGHTS_URL} elsewhere and pass metrics.inception_weights=PATH"
        )
        raise MetricsError(f"Could not build Inception-v3 features ({type(err).__name__}: {err}); {how}.") from err


def kid_kernel(cfg: MetricsConfig) -> str:
    """KID's kernel in words, as distribution_metrics chooses it."""
    if cfg.features == FeatureSpace.inception:
        return "(x.y / d + 1)^3, the published KID's (Binkowski et al. 2018)"
    return "(x.y / E|f_real|^2 + 1)^3, scale-free: comparable only within this classifier"


def split_channels(images: Tensor) -> Tensor:
    """(N, C, H, W) -> (N * C, 1, H, W): each channel as a grayscale image, in channel order."""
    return images.reshape(-1, 1, *images.shape[-2:])


@torch.inference_mode()
def batched(net: nn.Module, images: Tensor, batch_size: int, device: torch.device) -> Tensor:
    """net over `images` (uint8, any device) in batches on `device`; float32 (N, ...) on the CPU.

    no_grad(): features are measured, never differentiated. `.float().cpu()` is the whole conversion:
    a round trip through numpy would copy the same float32 values once more.
    """
    with torch.no_grad():
        return torch.cat([net(chunk.to(device)).float().cpu() for chunk in images.split(batch_size)])


def predict(
    classifier: Classifier, images: Tensor, batch_size: int, device: torch.device, per_channel: bool = False
) -> Tensor:
    """Predicted classes (N,); per_channel: one digit per channel, read as 100 a + 10 b + c."""
    was_training = classifier.training
    classifier.eval()
    try:
        if not per_channel:
            return batched(classifier, images, batch_size, device).argmax(dim=1)
        digits = batched(classifier, split_channels(images), batch_size, device).argmax(dim=1)
        digits = digits.view(images.size(0), images.size(1))  # (N, C), most significant channel first
        return (digits * 10 ** torch.arange(images.size(1) - 1, -1, -1)).sum(dim=1)
    finally:
        classifier.train(was_training)


# FID and KID through torchmetrics -----------------------------------------------------------------


class Precomputed(nn.Module):
    """The identity, as torchmetrics' feature extractor: features are computed once per image set
    and shared by FID, KID and the k-NN metrics, instead of once per metric."""

    def __init__(self, num_features: int):
        super().__init__()
        self.num_features = num_features

    def forward(self, features: Tensor) -> Tensor:
        return features


def fid(real: Tensor, fake: Tensor) -> float:
    """Fréchet distance between Gaussians fitted to two feature sets (Heusel et al. 2017)."""
    metric = FrechetInceptionDistance(feature=Precomputed(real.size(1)))
    metric.update(real, real=True)
    metric.update(fake, real=False)
    return float(metric.compute())


def kid(
    real: Tensor, fake: Tensor, subsets: int, subset_size: int, seed: int = 0, gamma: Optional[float] = None
) -> tuple[float, float]:
    """Kernel Inception Distance (Binkowski et al. 2018): unbiased MMD^2, cubic polynomial kernel,
    mean and standard deviation over random subsets of min(subset_size, N) images.

    The kernel is (gamma x.y + 1)^3. The published KID's gamma = 1/d (torchmetrics' default, and
    torch-fidelity's and clean-fid's) suits Inception's features, and distribution_metrics passes it
    for them. Our classifier's ReLU features are far larger (|f|^2 ~ 2000 at d = 128) and the cube
    then explodes (KID(x, x) = -1.4 +- 9.1 measured), so gamma=None takes 1 / E|f_real|^2, which puts
    x.y near 1 for any feature scale: the kernel is scale-free, and the reference set fixes the scale.
    """
    if gamma is None:
        gamma = 1.0 / float(real.double().square().sum(dim=1).mean())
    size = min(subset_size, real.size(0), fake.size(0))
    with warnings.catch_warnings():  # "KID will save all extracted features in buffer": intended here
        warnings.simplefilter("ignore", UserWarning)
        metric = KernelInceptionDistance(
            feature=Precomputed(real.size(1)), subsets=subsets, subset_size=size, gamma=gamma
        )
    metric.update(real.double(), real=True)  # float64: the MMD is a small difference of large sums
    metric.update(fake.double(), real=False)
    with torch.random.fork_rng(devices=[]):  # subsets drawn with torch.randperm: seeded, caller untouched
        torch.manual_seed(seed)
        mean, std = metric.compute()
    return float(mean), float(std)


# improved precision/recall and density/coverage: k-nearest-neighbour balls -----------------------


def knn_radius(features: Tensor, ks: tuple[int, ...], chunk: int = 1024) -> list[Tensor]:
    """For each k in ks: every point's distance to its k-th nearest other point (N,)."""
    kmax = max(ks)
    nearest = torch.cat(
        [torch.cdist(rows, features).topk(kmax + 1, dim=1, largest=False).values for rows in features.split(chunk)]
    )  # column 0 is the point itself
    return [nearest[:, k] for k in ks]


def precision_recall_density_coverage(
    real: Tensor, fake: Tensor, pr_k: int = 3, dc_k: int = 5, chunk: int = 1024
) -> dict[str, float]:
    """Four k-NN statistics of two feature sets, strict `<` as the reference code (clovaai/prdc).

    Each real point owns a ball reaching its k-th nearest real neighbour; the union of the balls
    estimates the real manifold (and likewise for fake points).
    - precision (Kynkaanniemi et al. 2019, k=3): share of fakes inside the real manifold (fidelity)
    - recall (same, k=3): share of reals inside the fake manifold (diversity)
    - density (Naeem et al. 2020, k=5): real balls per fake, / k; about 1 when matched, above 1
      when fakes crowd where reals are dense; robust to outliers among the reals
    - coverage (same, k=5): share of reals whose ball holds at least one fake
    The real-to-fake distances are taken in row chunks: 10k x 10k at once would be 400 MB.
    """
    real_pr, real_dc = knn_radius(real, (pr_k, dc_k), chunk)
    (fake_pr,) = knn_radius(fake, (pr_k,), chunk)
    in_real_manifold = torch.zeros(fake.size(0), dtype=torch.bool)
    balls_per_fake = torch.zeros(fake.size(0))
    in_fake_manifold, covered = [], []
    for start in range(0, real.size(0), chunk):
        distance = torch.cdist(real[start : start + chunk], fake)  # (rows, M)
        r_pr = real_pr[start : start + chunk, None]
        r_dc = real_dc[start : start + chunk, None]
        in_real_manifold |= (distance < r_pr).any(dim=0)
        balls_per_fake += (distance < r_dc).sum(dim=0)
        in_fake_manifold.append((distance < fake_pr[None, :]).any(dim=1))
        covered.append(distance.min(dim=1).values < r_dc[:, 0])
    return {
        "precision": float(in_real_manifold.float().mean()),
        "recall": float(torch.cat(in_fake_manifold).float().mean()),
        "density": float(balls_per_fake.sum() / (dc_k * fake.size(0))),
        "coverage": float(torch.cat(covered).float().mean()),
    }


def distribution_metrics(real: Tensor, fake: Tensor, cfg: MetricsConfig, seed: int = 0) -> dict[str, float]:
    """FID, KID, precision/recall and density/coverage of two feature sets (N, d) and (M, d).
    KID's kernel is the published one (gamma = 1/d) in Inception's feature space, the scale-free one
    in the classifier's (kid_kernel says which)."""
    results = {"fid": fid(real, fake)}
    gamma = 1.0 / real.size(1) if cfg.features == FeatureSpace.inception else None
    results["kid_mean"], results["kid_std"] = kid(real, fake, cfg.kid_subsets, cfg.kid_subset_size, seed, gamma)
    results.update(precision_recall_density_coverage(real, fake, cfg.pr_k, cfg.dc_k))
    return results


# class and mode coverage -------------------------------------------------------------------------


def histogram(labels: Tensor, num_classes: int) -> Tensor:
    """Share of each class, float64 (num_classes,)."""
    return torch.bincount(labels, minlength=num_classes).double() / max(labels.numel(), 1)


def kl_divergence(q: Tensor, p: Tensor) -> float:
    """KL(q || p) = sum q log(q / p) in nats; empty classes of q add 0 (0 log 0 = 0)."""
    present = q > 0
    return float((q[present] * (q[present] / p[present]).log()).sum())


def class_coverage(
    fake_labels: Tensor, real_labels: Tensor, num_classes: int, threshold: float = 0.01
) -> dict[str, float]:
    """Classes holding >= threshold of the samples, and KL(samples' classes || data's classes).

    The data's histogram is add-one smoothed (Laplace): a class the data lacks costs about
    log(N) instead of infinity. Both histograms come from the same classifier's predictions, so
    its mistakes fall on both sides alike.
    """
    q = histogram(fake_labels, num_classes)
    p = (torch.bincount(real_labels, minlength=num_classes).double() + 1) / (real_labels.numel() + num_classes)
    return {"classes_covered": int((q >= threshold).sum()), "class_kl": kl_divergence(q, p)}


def mode_coverage(fake_modes: Tensor, num_modes: int = 1000) -> dict[str, float]:
    """Stacked-MNIST modes: how many of the num_modes digit triples appear at least once, and
    KL(samples' modes || uniform), as in Metz et al. 2017, Srivastava et al. 2017, Lin et al. 2018.

    Also `digit_kl_ch{c}`: KL(channel c's digits || uniform over 10), which tells a mode KL caused
    by one channel's unbalanced digits (each channel's KL adds to the mode KL when the channels are
    independent) from one spread over the joint."""
    q = histogram(fake_modes, num_modes)
    uniform = torch.full((num_modes,), 1.0 / num_modes, dtype=torch.float64)
    results = {"modes_covered": int((q > 0).sum()), "mode_kl": kl_divergence(q, uniform)}
    ten = torch.full((10,), 0.1, dtype=torch.float64)
    for channel, digits in enumerate(mode_digits(fake_modes)):
        results[f"digit_kl_ch{channel}"] = kl_divergence(histogram(digits, 10), ten)
    return results


def mode_digits(modes: Tensor) -> list[Tensor]:
    """Stacked modes 100 a + 10 b + c -> [a, b, c], one digit tensor per channel."""
    return [torch.div(modes, power, rounding_mode="floor") % 10 for power in (100, 10, 1)]


def is_stacked(dataset: ImageSet) -> bool:
    """Stacked-MNIST-like: 1000 classes over 3 channels, label = 100 a + 10 b + c per channel."""
    return dataset.num_classes == 1000 and dataset.images.size(1) == 3


def with_gaussian_noise(images: Tensor, sigma: float, seed: int = 0) -> Tensor:
    """uint8 images + N(0, sigma^2) noise, sigma in units of the full intensity range ([0, 1]), clipped
    and rounded back to uint8: the calibration degradation of the honesty tests (Heusel et al. 2017,
    fig. 1, do the same with Inception)."""
    noise = torch.randn(images.shape, generator=torch.Generator().manual_seed(seed)) * (255 * sigma)
    return (images.float() + noise).round_().clamp_(0, 255).to(torch.uint8)


def with_gaussian_blur(images: Tensor, sigma: float) -> Tensor:
    """uint8 images (N, C, H, W) through a 3 x 3 Gaussian blur of `sigma` pixels (torchvision's),
    rounded back to uint8: a degradation too slight to see at sigma 0.5, which shows how sharp a
    recall target asks samples to be (scripts/calibrate.py)."""
    smooth = gaussian_blur(images.float(), kernel_size=[3, 3], sigma=[sigma, sigma])
    return smooth.round_().clamp_(0, 255).to(torch.uint8)
