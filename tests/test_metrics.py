"""The metrics' arithmetic against brute force, and honesty checks: each fails if a metric is blind to a degradation."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import re

import pytest
import torch
from conftest import TinyNVlabsInception, write_torchscript
from torch import nn
from torchmetrics.image.kid import KernelInceptionDistance

from gan.config import ClassifierConfig, DataConfig, FeatureSpace, MetricsConfig
from gan.data import ImageSet, render_digits
from gan.evaluation import metrics as M

CPU = torch.device("cpu")
STATED_ACCURACY = 0.97  # the tiny test classifier must reach this on the held-out digits (measured 0.995)
TINY_CLASSIFIER, TINY_METRICS = ClassifierConfig(epochs=3), MetricsConfig(kid_subsets=20, kid_subset_size=500)


@pytest.fixture(scope="module")
def digits() -> dict:
    """Training and held-out digits, the classifier, and the held-out features and predictions; one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    train = ImageSet(*render_digits(2000, 16, seed=0), num_classes=10)
    held_out = ImageSet(*render_digits(1000, 16, seed=1_000_003), num_classes=10)
    classifier, accuracy = M.train_classifier(train, held_out, TINY_CLASSIFIER, CPU)
    features = M.ClassifierFeatures(classifier)
    found = dict(train=train, held_out=held_out, classifier=classifier, accuracy=accuracy, features=features)
    found["real_features"] = M.batched(features, held_out.images, 500, CPU)
    found["real_labels"] = M.predict(classifier, held_out.images, 500, CPU)
    yield found
    torch.set_num_threads(threads)


def measure(digits: dict, images: torch.Tensor) -> dict:
    """Every metric of `images` against the held-out digits, as evaluate.py computes them."""
    fake_features = M.batched(digits["features"], images, 500, CPU)
    results = M.distribution_metrics(digits["real_features"], fake_features, TINY_METRICS)
    results.update(M.class_coverage(M.predict(digits["classifier"], images, 500, CPU), digits["real_labels"], 10))
    return results


def training_images(digits: dict, keep: torch.Tensor | None = None, count: int = 1000) -> torch.Tensor:
    """`count` training images (other images than the held-out ones), optionally of some classes only."""
    train = digits["train"]
    pool = torch.arange(train.labels.numel()) if keep is None else torch.nonzero(keep).flatten()
    return train.images[pool[torch.randperm(pool.numel(), generator=torch.Generator().manual_seed(1))[:count]]]


def test_classifier_reaches_the_stated_accuracy_and_its_features_are_the_penultimate_layer(digits):
    assert digits["accuracy"] >= STATED_ACCURACY
    images = digits["held_out"].images[:8]
    features = digits["features"](images)
    assert features.shape == (8, TINY_CLASSIFIER.feature_dim) and (features >= 0).all()  # after ReLU
    torch.testing.assert_close(digits["classifier"].head(features), digits["classifier"](images))


# honesty: each check would fail if the metric were blind to what it is meant to see ---------------
def test_noise_blur_dropped_classes_and_repeats_each_move_the_metrics_meant_to_see_them(digits):
    base = training_images(digits)
    real, *noisy = [measure(digits, M.with_gaussian_noise(base, s) if s else base) for s in (0, 0.1, 0.2, 0.3, 0.5)]
    # N = 1000: the floor is not 0 (a finite sample's covariance is noisy), 1.2-1.4 against 3.3-4.8 at the mildest noise
    assert real["fid"] < 0.5 * noisy[0]["fid"]
    assert abs(real["kid_mean"]) < 3 * real["kid_std"]  # KID is unbiased: about 0 for equal distributions
    assert min(real["precision"], real["recall"], real["coverage"]) > 0.85
    assert 0.9 < real["density"] < 1.1
    assert real["classes_covered"] == 10 and real["class_kl"] < 0.03
    fids, kids = [r["fid"] for r in (real, *noisy)], [r["kid_mean"] for r in (real, *noisy)]
    assert fids == sorted(fids) and len(set(fids)) == len(fids), fids
    assert kids == sorted(kids), kids
    assert noisy[-1]["precision"] < 0.2 < 0.8 < real["precision"]
    # slight blur, scripts/calibrate.py's finding: blurred real images stay inside the real manifold (precision) but
    # no longer cover it (recall), as smooth samples do. Here recall 0.91 -> 0.61, precision 0.92 -> 0.86
    soft = measure(digits, M.with_gaussian_blur(base, 0.5))
    assert soft["recall"] < real["recall"] - 0.15 and soft["precision"] > real["precision"] - 0.1
    assert soft["fid"] > real["fid"]
    dot = torch.zeros(1, 1, 5, 5, dtype=torch.uint8)
    dot[0, 0, 2, 2] = 200
    spread = M.with_gaussian_blur(dot, 0.5)
    assert spread.dtype == torch.uint8 and spread.shape == dot.shape
    assert 0 < spread[0, 0, 2, 1] < spread[0, 0, 2, 2] < 200  # the dot spreads to its neighbours
    assert spread[0, 0, 0, 0] == 0 and abs(int(spread.sum()) - 200) <= 8  # 3 x 3 reach; mass kept but rounding
    # half the classes dropped: classes_covered falls, class_kl rises (about log 2 = 0.69)
    half = measure(digits, training_images(digits, keep=digits["train"].labels >= 5))
    assert real["classes_covered"] == 10 and half["classes_covered"] == 5
    assert half["class_kl"] > 0.5 > 0.05 > real["class_kl"]
    assert half["recall"] < real["recall"] - 0.3  # the missing half of the data is not covered
    # 100 images repeated 10 times: recall and coverage collapse
    repeated = measure(digits, training_images(digits, count=100).repeat(10, 1, 1, 1))
    assert repeated["recall"] < 0.05 < 0.85 < real["recall"]  # a repeated image's k-NN ball has radius 0
    assert repeated["coverage"] < 0.5 < 0.9 < real["coverage"]  # 100 distinct images cover about 35%
    assert repeated["precision"] > 0.8  # each repeated image is a real digit: fidelity is not the problem
    assert repeated["classes_covered"] == 10  # the class histogram is blind to this collapse


@pytest.mark.filterwarnings("ignore:Metric `Kernel Inception Distance` will save:UserWarning")
def test_kid_gamma_keeps_the_kernel_scale_free_and_in_inception_space_is_the_published_kernel():
    # ReLU-like features with |f|^2 in the thousands, as the classifier's: gamma = 1/d would explode the cubic
    # kernel; with 1/E|f|^2 two samples of one distribution score about 0, whatever the features' scale
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(600, 64, generator=gen).abs() * 6 for _ in range(2))
    mean, std = M.kid(a, b, subsets=20, subset_size=300)
    assert abs(mean) < 0.01 and std < 0.01
    assert M.kid(100 * a, 100 * b, subsets=20, subset_size=300) == pytest.approx((mean, std), rel=1e-6, abs=1e-9)
    # kid_subset_size at or above the sample count: every subset is the same draw, whose spread is rounding
    whole, halves = M.kid(a, b + 1, subsets=5, subset_size=1000), M.kid(a, b + 1, subsets=5, subset_size=100)
    assert whole[1] == 0.0 and whole[0] > 0 and halves[1] > 1e-6
    # gamma = 1/d, torchmetrics' default (and torch-fidelity's and clean-fid's): KID compares with theirs
    a, b = torch.rand(300, 64, generator=gen), torch.rand(300, 64, generator=gen) + 0.05
    metric = KernelInceptionDistance(feature=nn.Identity(), subsets=10, subset_size=100)
    metric.update(a.double(), real=True)
    metric.update(b.double(), real=False)
    torch.manual_seed(3)
    expected = tuple(float(v) for v in metric.compute())
    inception_space = dataclasses.replace(TINY_METRICS, features=FeatureSpace.inception, kid_subsets=10)
    assert M.kid(a, b, 10, 100, seed=3, gamma=1 / 64) == pytest.approx(expected, rel=1e-9)
    results = M.distribution_metrics(a, b, dataclasses.replace(inception_space, kid_subset_size=100), seed=3)
    assert (results["kid_mean"], results["kid_std"]) == pytest.approx(expected, rel=1e-9)
    assert "published" in M.KID_KERNELS[FeatureSpace.inception]
    assert "scale-free" in M.KID_KERNELS[FeatureSpace.classifier]


# the arithmetic, against brute force -------------------------------------------------------------
def test_prdc_in_chunks_equals_brute_force_and_fid_has_its_closed_forms():
    """Kynkaanniemi et al. and Naeem et al. written out on full distance matrices (k = 3 and 5)."""
    gen = torch.Generator().manual_seed(0)
    real, fake = torch.randn(150, 8, generator=gen), torch.randn(120, 8, generator=gen) * 1.3 + 0.2
    rf = torch.cdist(real, fake)  # below: each point's distances to its own set, sorted (column 0: itself)
    real_nn, fake_nn = torch.cdist(real, real).sort(dim=1).values, torch.cdist(fake, fake).sort(dim=1).values
    brute = {
        "precision": (rf < real_nn[:, 3, None]).any(0).float().mean().item(),
        "recall": (rf < fake_nn[None, :, 3]).any(1).float().mean().item(),
        "density": (rf < real_nn[:, 5, None]).sum().item() / (5 * fake.size(0)),
        "coverage": (rf.min(1).values < real_nn[:, 5]).float().mean().item(),
    }
    assert M.precision_recall_density_coverage(real, fake, pr_k=3, dc_k=5, chunk=32) == pytest.approx(brute, abs=1e-6)
    # FID: 0 for identical sets, the squared shift of the means for shifted ones
    x = torch.randn(2000, 4, generator=torch.Generator().manual_seed(0))
    assert M.fid(x, x) == pytest.approx(0.0, abs=1e-3)
    assert M.fid(x, x + torch.tensor([3.0, 0, 0, 0])) == pytest.approx(9.0, abs=1e-2)  # |mu1 - mu2|^2


def test_class_and_mode_coverage_and_kl_on_known_histograms():
    real = torch.arange(10).repeat(100)  # uniform over 10 classes
    assert M.class_coverage(real, real, 10) == {"classes_covered": 10, "class_kl": pytest.approx(0, abs=1e-9)}
    result = M.class_coverage(torch.arange(5).repeat(200), real, 10)
    assert result == {"classes_covered": 5, "class_kl": pytest.approx(math.log(2), abs=0.01)}
    rare = torch.cat([torch.zeros(995, dtype=torch.long), torch.ones(5, dtype=torch.long)])
    assert M.class_coverage(rare, real, 10, threshold=0.01)["classes_covered"] == 1  # 0.5% is not covered
    # modes: digit triples, their KL to uniform
    zero = pytest.approx(0, abs=1e-9)
    uniform = {"modes_covered": 1000, "mode_kl": zero, **{f"digit_kl_ch{c}": zero for c in range(3)}}
    assert M.mode_coverage(torch.arange(1000)) == uniform
    one_mode = M.mode_coverage(torch.full((500,), 123))
    assert one_mode["modes_covered"] == 1 and one_mode["mode_kl"] == pytest.approx(math.log(1000))
    assert [one_mode[f"digit_kl_ch{c}"] for c in range(3)] == pytest.approx([math.log(10)] * 3)
    # the last channel shows only even digits, the others stay uniform: only its KL moves (log 2)
    evens = M.mode_coverage(torch.arange(1000)[torch.arange(1000) % 2 == 0])
    assert evens["modes_covered"] == 500 and evens["mode_kl"] == pytest.approx(math.log(2))
    assert [evens[f"digit_kl_ch{c}"] for c in range(3)] == pytest.approx([0, 0, math.log(2)], abs=1e-9)


def test_stacked_images_are_classified_channel_by_channel(digits):
    # Stacked-MNIST built by hand: three held-out digits as R, G, B; label 100 r + 10 g + b.
    held_out = digits["held_out"]
    triples = torch.randint(0, 1000, (600, 3), generator=torch.Generator().manual_seed(0))
    labels = (held_out.labels[triples] * torch.tensor([100, 10, 1])).sum(1)
    stacked = ImageSet(held_out.images[triples].flatten(1, 2), labels, 1000)
    assert M.is_stacked(stacked) and not M.is_stacked(held_out)
    modes = M.predict(digits["classifier"], stacked.images, 500, CPU, per_channel=True)
    assert (modes == stacked.labels).float().mean() > STATED_ACCURACY**3 - 0.03
    assert M.mode_coverage(modes)["modes_covered"] > 400  # 600 draws over 1000 modes hit about 450
    collapsed = stacked.images.clone()
    collapsed[:, 1:] = stacked.images[0, 1:]  # green and blue frozen: at most 10 modes remain
    collapsed_modes = M.predict(digits["classifier"], collapsed, 500, CPU, per_channel=True)
    assert M.mode_coverage(collapsed_modes)["modes_covered"] <= 10
    features = M.ClassifierFeatures(digits["classifier"], per_channel=True, channels=3)
    assert features(stacked.images[:4]).shape == (4, 3 * TINY_CLASSIFIER.feature_dim) == (4, features.num_features)


def test_classifier_is_cached_under_data_root_keyed_by_what_decides_it(tmp_path, monkeypatch, one_thread):
    data, config = DataConfig(root=str(tmp_path), image_size=16, num_samples=1200, batch_size=32), ClassifierConfig()
    model, accuracy, path = M.load_or_train_classifier(data, config, CPU)
    assert path.parent == tmp_path / "classifiers" and path.name.startswith("digits-16px-1ch-")
    assert torch.load(path, weights_only=True)["accuracy"] == accuracy >= 0.9  # a plain dict of tensors, containers
    monkeypatch.setattr(M, "train_classifier", lambda *args: pytest.fail("a cached classifier was trained again"))
    again, accuracy_again, path_again = M.load_or_train_classifier(data, config, CPU)
    assert path_again == path and accuracy_again == accuracy
    # a run on fewer generated digits (debug=tiny's 256) is measured with the same classifier
    assert M.load_or_train_classifier(dataclasses.replace(data, num_samples=256), config, CPU)[2] == path
    images = torch.randint(0, 256, (4, 1, 16, 16), dtype=torch.uint8)
    torch.testing.assert_close(again.eval()(images), model.eval()(images))
    # What decides the images or the training changes the key; where they live, or the bar, does not.
    key = M.classifier_key(data, config)
    assert M.classifier_key(dataclasses.replace(data, root="elsewhere", batch_size=7), config) == key
    assert M.classifier_key(data, dataclasses.replace(config, min_accuracy=0.5)) == key
    assert M.classifier_key(dataclasses.replace(data, seed=1), config) != key
    assert M.classifier_key(data, dataclasses.replace(config, epochs=2)) != key
    with pytest.raises(M.MetricsError, match="min_accuracy"):
        M.load_or_train_classifier(data, dataclasses.replace(config, min_accuracy=1.01), CPU)


def test_inception_without_torch_fidelity_says_how_to_get_it(tmp_path, monkeypatch):
    weights = tmp_path / "weights.pth"
    weights.write_bytes(b"not really weights")
    monkeypatch.setattr(M.importlib.util, "find_spec", lambda name: None)  # as on a machine without it
    pytest.raises(M.MetricsError, inception, inception_weights=str(weights)).match("pip install torch-fidelity")


# the two Inception-v3 files: a random-valued stand-in for each, through the code real files take --
def inception(**files: str) -> nn.Module:
    return M.inception_network(MetricsConfig(features=FeatureSpace.inception, **files))


@pytest.mark.parametrize("key", ["inception_weights", "feature_network"])
def test_each_inception_file_loads_and_gives_finite_2048_d_features(
    key, inception_weights, nvlabs_inception, one_thread, caplog
):
    # torch-fidelity's state dict goes through its own loading (feature_extractor_weights_path) as the published one
    # would; random values are not the published weights: the sha256 check says so, and metrics.json records it
    path = inception_weights if key == "inception_weights" else nvlabs_inception
    with caplog.at_level(logging.WARNING, logger=M.__name__):
        net = inception(**{key: str(path)})
    assert isinstance(net, M.Inception) and net.torchscript == (key == "feature_network")
    assert ("not comparable with published FIDs" in caplog.text) == (key == "inception_weights")
    real, fake = render_digits(4, 16, seed=0)[0], M.with_gaussian_noise(render_digits(4, 16, seed=1)[0], 0.2)
    real_features, fake_features = M.batched(net, real, 4, CPU), M.batched(net, fake, 4, CPU)
    assert real_features.shape == (4, 2048) and torch.isfinite(real_features).all()
    torch.testing.assert_close(M.batched(net, real[:2].repeat(1, 3, 1, 1), 2, CPU), real_features[:2])  # gray: RGB
    assert not torch.equal(real_features, fake_features)  # FIDs in 2048 dimensions: test_evaluate's end to end
    space = net.feature_space
    assert space["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    resizer = "interpolate_bilinear_2d_like_tensorflow1x" if key == "inception_weights" else "TorchScript file's own"
    assert resizer in space["resizer"] and space.get("published_weights", False) is False and space["dims"] == 2048


WRONG_FILES = [  # (key, file, what the message says)
    ("inception_weights", "garbage", "cannot be read as a state dict of tensors"),
    ("inception_weights", "nvlabs", "It is a TorchScript file: pass it as metrics.feature_network"),
    ("inception_weights", "foreign", "is a state dict, but not of torch-fidelity's Inception-v3"),
    ("feature_network", "weights", "is not a TorchScript file"),
    ("feature_network", "garbage", "is not a TorchScript file"),
    ("feature_network", "no_return_features", "return_features=True) fails"),
    ("feature_network", "64_features", "returns a torch.float32 tensor of shape (2, 64)"),
    ("feature_network", "missing", "no such file"),
    ("inception_weights", "missing", "no such file"),  # checked before anything else
]


@pytest.mark.parametrize("key, file, message", WRONG_FILES, ids=[f"{key}={file}" for key, file, _ in WRONG_FILES])
def test_a_wrong_inception_file_is_one_clear_paragraph(
    key, file, message, tmp_path, inception_weights, nvlabs_inception
):
    # a file of each kind a user could give to the wrong key, or that is not the network at all
    (tmp_path / "garbage.pth").write_bytes(b"not really weights")
    torch.save(nn.Linear(3, 2).state_dict(), tmp_path / "foreign.pth")
    write_torchscript(nn.Identity(), tmp_path / "no_return_features.pth")  # forward(input) alone
    write_torchscript(TinyNVlabsInception(dims=64), tmp_path / "64_features.pth")
    path = {"weights": inception_weights, "nvlabs": nvlabs_inception}.get(file, tmp_path / f"{file}.pth")
    with pytest.raises(M.MetricsError, match=re.escape(message)) as caught:
        inception(**{key: str(path)})
    text = str(caught.value)
    assert text.startswith(f"metrics.{key}={path}") and "\n" not in text and "Traceback" not in text
