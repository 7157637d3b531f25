"""Sample quality of the EMA generator every `trainer.eval_every` steps; the best is kept (checkpoints/best.pt).
The reference is the training split, never the held-out one: best.pt is picked by these numbers, and a pick
on the test split would flatter it. A cheap cut of evaluate.py's measurement, so a little above its numbers."""

import dataclasses
import logging
import time

import torch
from torch import Tensor, nn

from gan.config import DataConfig, EvaluateConfig
from gan.data import ImageSet
from gan.errors import ConfigError
from gan.evaluation import metrics as M
from gan.evaluation.conditional import sample_classes
from gan.evaluation.pipeline import Reals, class_metrics, classifier_data, generate, reference_subset

log = logging.getLogger(__name__)

_NAMES = ("precision", "recall", "density", "coverage", "classes_covered", "class_kl", "modes_covered", "mode_kl")
QUALITY_TAGS = {"fid": "quality/FID", **{name: f"quality/{name}" for name in _NAMES}}  # FID first: capitals sort first
FID_TAG = QUALITY_TAGS["fid"]
# A run's result, written at its end, one point each: the group sorts before `loss`, so it is the first group that
# TensorBoard opens and the first metrics (the first columns) of its HParams page (docs/watching.md)
BEST_FID_TAG = "FID/best"  # the lowest quality/FID: the generator in checkpoints/best.pt (its step: the curve's lowest)
FINAL_FID_TAG = "FID/final"  # trainer.final_eval_samples: evaluate.py's FID of the last checkpoint


class QualityProbe:
    """The same seeded latents every time, so the curve moves with G alone."""

    def __init__(self, data: DataConfig, training: ImageSet, samples: int, seed: int, device: torch.device):
        started = time.perf_counter()
        if training.num_classes < 2:
            raise ConfigError(
                f"trainer.eval_every needs labelled data: data={data.name} has {training.num_classes} class, "
                "and the in-training FID is measured in the features of a classifier of the data's classes. "
                "Set trainer.eval_every=0 and measure with evaluate.py metrics.features=inception."
            )
        # fork_rng keeps the training's random stream as it would be without the probe
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            images, labels = reference_subset(training, samples, seed, "training split", "trainer.eval_samples")
            images, labels = images.cpu(), labels.cpu()  # the split may live on the training device
            self.reals = Reals(images, labels, stacked=M.is_stacked(training))
            self.config = EvaluateConfig(checkpoint="(training)", num_samples=samples, seed=seed, batch_size=500)
            bar = self.config.metrics.classifier.min_accuracy
            accept_any = dataclasses.replace(self.config.metrics.classifier, min_accuracy=0.0)
            labelled = classifier_data(data, self.reals.stacked)
            classifier, accuracy, path = M.load_or_train_classifier(labelled, accept_any, device)
        if accuracy < bar:
            log.warning(
                f"The metrics classifier of data={data.name} reaches {100 * accuracy:.2f}% test accuracy, below "
                f"evaluate.py's bar of {100 * bar:.0f}%: the in-training FID and the pick of best.pt use its features "
                "all the same (they need a consistent feature space); evaluate.py refuses it unless given "
                "metrics.classifier.min_accuracy."
            )
        self.classifier: M.Classifier = classifier
        self.features = M.ClassifierFeatures(classifier, self.reals.stacked, images.size(1)).to(device)
        self.device = device
        self.real_features = M.batched(self.features, images, self.config.batch_size, device)
        log.info(
            f"In-training quality: {samples} samples against {images.size(0)} validation images from the training "
            f"split, features of {path.name} ({100 * accuracy:.2f}% accuracy); set up in "
            f"{time.perf_counter() - started:.1f} s"
        )

    def measure(self, G: nn.Module) -> dict[str, float]:
        cfg = self.config
        labels = sample_classes(self.reals.labels, cfg.num_samples, None, cfg.seed) if G.num_classes else None
        fake: Tensor = generate(G, cfg.num_samples, cfg.batch_size, cfg.seed, self.device, labels)
        real, fake_features = self.real_features, M.batched(self.features, fake, cfg.batch_size, self.device)
        results = {"fid": M.fid(real, fake_features)}
        results.update(M.precision_recall_density_coverage(real, fake_features, cfg.metrics.pr_k, cfg.metrics.dc_k))
        results.update(class_metrics(self.classifier, self.reals, fake, cfg, self.device))
        return {QUALITY_TAGS[key]: float(value) for key, value in results.items() if key in QUALITY_TAGS}
