"""What is a good FID on this dataset? Metrics of real images, and of real images plus noise.

    python scripts/calibrate.py data=digits
    python scripts/calibrate.py data=fashion_mnist data.root=/path/to/datasets \
        metrics.classifier.epochs=5 metrics.classifier.min_accuracy=0.9

Measures, against the held-out split and in evaluate.py's feature space (the same cached
classifier, so pass the same metrics.classifier.* as to evaluate.py): a subset of the training
split (the floor a perfect generator reaches), that subset with Gaussian noise of
sigma = 0.05, 0.1, 0.2, 0.3 of the intensity range, and that subset blurred (a 3 x 3 Gaussian of
sigma 0.5 and 1 pixel). The results issue's quality bar is the sigma = 0.2 row; the small
degradations show how close to real images a recall or precision target asks a generator to come.
Prints a table; nothing is written but the classifier cache.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gan.data import load_dataset  # noqa: E402
from gan.device import resolve_device  # noqa: E402
from gan.evaluation import metrics as M  # noqa: E402
from gan.evaluation.pipeline import reference_subset  # noqa: E402
from scripts.compare import metrics_config, train_config  # noqa: E402

NUM = 10000
SIGMAS = (0.05, 0.1, 0.2, 0.3)
BLURS = (0.5, 1.0)


def main(overrides: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    data = train_config([o for o in overrides if o.startswith("data")]).data
    metrics_cfg = metrics_config(overrides)
    device = resolve_device("auto")
    held_out = load_dataset(data, train=False, in_memory=True)
    train = load_dataset(data, train=True, in_memory=True)
    classifier, accuracy, path = M.load_or_train_classifier(data, metrics_cfg.classifier, device)
    features = M.ClassifierFeatures(classifier, per_channel=False, channels=held_out.images.size(1)).to(device)
    real, _ = reference_subset(held_out, NUM, seed=0)
    candidate, _ = reference_subset(train, NUM, seed=1)
    real_features = M.batched(features, real, 500, device)
    rows = {"real (training split)": candidate}
    rows.update({f"real + noise sigma={s}": M.with_gaussian_noise(candidate, s) for s in SIGMAS})
    rows.update({f"real, blurred {s} px": M.with_gaussian_blur(candidate, s) for s in BLURS})
    print(f"\ndata={data.name}, classifier {path.name} ({accuracy:.2%} test accuracy), {NUM} vs {real.size(0)}")
    print(f"{'images':<26} {'FID':>8} {'KID':>8} {'prec':>6} {'recall':>6} {'dens':>6} {'cover':>6}")
    for name, images in rows.items():
        result = M.distribution_metrics(real_features, M.batched(features, images, 500, device), metrics_cfg)
        print(
            f"{name:<26} {result['fid']:>8.2f} {result['kid_mean']:>8.4f} {result['precision']:>6.3f} "
            f"{result['recall']:>6.3f} {result['density']:>6.3f} {result['coverage']:>6.3f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
