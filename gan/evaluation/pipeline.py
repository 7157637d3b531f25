"""evaluate(): sample uint8 images, measure them against the held-out split, draw, export and report."""

import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
import time
import warnings
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional

import numpy as np
import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from PIL import Image
from tensorboard.plugins.text.summary_v2 import text_pb
from torch import Tensor, nn
from torch.export import Dim
from torch.optim.swa_utils import update_bn
from torch.utils.data import DataLoader
from torch.utils.tensorboard import SummaryWriter
from torchvision.utils import save_image

import gan.checkpoint as ckpt
from gan.config import DataConfig, EvaluateConfig, ExportFormat, FeatureSpace, SaveSamples
from gan.core.models import Generator
from gan.core.sampling import class_rows, image_grid, sample
from gan.data import ImageSet, load_dataset, take, to_unit_range
from gan.device import environment, environment_changes, setup_torch
from gan.errors import CheckpointError, ConfigError, MetricsError
from gan.evaluation import metrics as M
from gan.run import Run

log = logging.getLogger(__name__)

# Sorted after the training's own: `summary` after `samples` (`samples_eval` would come first), the table after run/*
IMAGES_GROUP, METRICS_TEXT_TAG = "summary", "run/eval_metrics"
SAVED = (("samples.npz", SaveSamples.npz), ("samples", SaveSamples.png))
MIN_PER_CLASS = 200  # the images per class intra-class FID needs, and d + 1 (else the covariance is singular)
Reals = NamedTuple("Reals", [("images", Tensor), ("labels", Tensor), ("stacked", bool)])  # held-out, measured against
# evaluate.py has no model.* settings that could change: a config at odds with its weights is damage
DAMAGED = "evaluate.py builds the generator from the checkpoint alone: it was damaged or edited after it was written."


def evaluate(
    cfg: EvaluateConfig, run_dir: Path, data_overrides: Optional[Mapping] = None, tb_dir: Optional[Path] = None
) -> dict[str, Any]:
    """metrics.json, PNGs and TensorBoard events into run_dir (events into `tb_dir`: train.py's final evaluation)."""
    done = {"start": time.perf_counter()}  # when each stage ended
    run = Run(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = setup_torch(cfg.device, cfg.threads, cfg.seed, "device")
    # Inception first: a missing file or package fails before any other work
    inception = M.inception_network(cfg.metrics) if cfg.metrics.features == FeatureSpace.inception else None
    state, source = ckpt.load_checkpoint(cfg.checkpoint, map_location="cpu"), str(cfg.checkpoint)
    data, num_classes = data_config_of(state, data_overrides or {}, source), classes_of(state, source)
    check_class_id(cfg.class_id, num_classes, source)
    if num_classes and cfg.export != ExportFormat.none:
        why = "export packages G(z) only. Leave export out (the checkpoint itself holds the generator)"
        raise ConfigError(f"export={cfg.export.value}: {source} holds a class-conditional G(z, y); {why}.")
    G, about = prepare_generator(state, cfg, device)
    log.info("Evaluating %s: step %d, %s generator, data=%s (%d px, %d channel(s))", cfg.checkpoint,
             about["step"], about["generator"], data.name, data.image_size, data.channels)  # fmt: skip
    reference, split = load_dataset(data, train=False, in_memory=True), f"the held-out split of data={data.name}"
    if cfg.class_id is not None:  # one class asked for: measured against that class's images alone
        keep, split = reference.labels == cfg.class_id, f"class_id={cfg.class_id}: {split} (that class)"
        reference = ImageSet(reference.images[keep], reference.labels[keep], reference.num_classes)
    reals = Reals(*reference_subset(reference, cfg.num_samples, cfg.seed), stacked=M.is_stacked(reference))
    for key, published in (("pr_k", 3), ("dc_k", 5)):  # each real image's ball reaches its k-th real neighbour
        k, count = getattr(cfg.metrics, key), reals.images.size(0)
        if k >= count:
            need = f"metrics.{key}={k} needs more than {k} real images; {split} holds {count}"
            todo = f"Lower metrics.{key} below {count} ({published} is the published setting)"
            raise MetricsError(f"{need}. {todo}, or measure against more held-out images.")
    done["data"] = time.perf_counter()
    classifier, accuracy, classifier_file = classifier_for(data, reference, reals.stacked, cfg, device)
    feature_net = (inception or M.ClassifierFeatures(classifier, reals.stacked, reference.images.size(1))).to(device)
    done["classifier"] = time.perf_counter()
    requested = M.sample_classes(reals.labels, cfg.num_samples, cfg.class_id, cfg.seed) if G.num_classes else None
    fake = generate(G, cfg.num_samples, cfg.batch_size, cfg.seed, device, requested)
    done["sampling"] = time.perf_counter()
    results = measure(feature_net, classifier, reals, fake, cfg, device, requested)
    space = getattr(feature_net, "feature_space", None) or {
        "network": "classifier: penultimate layer of a small CNN trained on the dataset's labels",
        "file": classifier_file, "dims": feature_net.num_features, "resizer": "none: images at data.image_size",
        "input": "uint8 at data.image_size, scaled to [-1, 1]",
    }  # fmt: skip
    space = {**space, "kid_kernel": M.KID_KERNELS[cfg.metrics.features], "measures": list(M.FEATURE_METRICS)}
    results.update(num_samples=fake.size(0), num_real=reals.images.size(0), real_split="held-out",
                   features=cfg.metrics.features.value, feature_space=space,
                   classifier=classifier_file, classifier_accuracy=accuracy, **about)  # fmt: skip
    done["metrics"] = time.perf_counter()
    pictures = draw_pictures(G, fake, data, cfg, device)
    for name, grid in pictures.items():
        save_image(grid, run_dir / f"{name}.png")
    done["pictures"] = time.perf_counter()
    write_samples(fake, *(run_dir / name if cfg.save_samples == how else None for name, how in SAVED))
    for path in save_generator(G, cfg.export, run.export):
        log.info("Exported the generator: %s", path)
    done["outputs"] = time.perf_counter()
    seconds = {stage: round(done[stage] - start, 3) for start, stage in zip(done.values(), list(done)[1:])}
    results.update(seconds={**seconds, "total": sum(seconds.values())}, environment=environment(device))
    results["training_environment"] = state.get("environment")  # as the checkpoint recorded it, if it did
    report(results, pictures, run.metrics, tb_dir or run.tb)
    return results


def report(results: dict[str, Any], pictures: Mapping[str, Tensor], metrics: Path, tb_dir: Path) -> None:
    """metrics.json, the log's table and TensorBoard's images and text table."""
    partial = metrics.with_name(f".{metrics.name}.tmp")  # replaced whole: a killed write never leaves half a file
    partial.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(partial, metrics)
    rows = {key: value for key, value in results.items() if not isinstance(value, Mapping)}
    rows["seconds"] = f"{results['seconds']['total']:.1f}"
    shown = {k: f"{v:.6g}" if isinstance(v, float) else "-" if v is None else str(v) for k, v in rows.items()}
    table = "\n".join(f"  {key:<{max(map(len, shown))}}  {text}" for key, text in shown.items())
    log.info("Metrics (%s features, %d samples vs %d held-out images):\n%s", results["features"],
             results["num_samples"], results["num_real"], table)  # fmt: skip
    log.info("Feature space: %(network)s, %(file)s; resizer: %(resizer)s", results["feature_space"])
    log.info("Environment: %s", ", ".join(f"{key} {value}" for key, value in results["environment"].items()))
    if changes := environment_changes(results["training_environment"], results["environment"]):
        log.info("Trained in another environment: %s", "; ".join(changes))
    with SummaryWriter(log_dir=str(tb_dir)) as writer:
        for name, grid in pictures.items():
            writer.add_image(f"{IMAGES_GROUP}/{name}", grid, results["step"])
        # a text table (one number is a one-point chart), under the tag itself: add_text would add /text_summary
        writer.file_writer.add_summary(text_pb(METRICS_TEXT_TAG, "```\n" + table + "\n```"), results["step"])


def prepare_generator(state: Mapping[str, Any], cfg: EvaluateConfig, device: torch.device) -> tuple[nn.Module, dict]:
    G, generator_name = build_generator(state, cfg.use_ema, device, source=str(cfg.checkpoint))
    recomputed = recompute_batchnorm_stats(G, cfg.bn_batches, cfg.batch_size, cfg.seed, device)
    bn_stats = f"recomputed ({cfg.bn_batches} x {cfg.batch_size} samples)" if recomputed else "checkpoint"
    about: dict[str, Any] = {"generator": generator_name, "batchnorm_stats": bn_stats, "step": int(state["step"])}
    classes = {"num_classes": G.num_classes, "class_id": cfg.class_id} if G.num_classes else {}
    return G, {**about, **classes, "checkpoint": str(cfg.checkpoint)}


def measure(
    feature_net: nn.Module,
    classifier: Optional[M.Classifier],
    reals: Reals,
    fake: Tensor,
    cfg: EvaluateConfig,
    device: torch.device,
    requested: Optional[Tensor] = None,
    real_features: Optional[Tensor] = None,
) -> dict[str, Any]:
    """`requested`: each sample's class (conditional G); `real_features`: precomputed, for many sample sets."""
    if real_features is None:
        real_features = M.batched(feature_net, reals.images, cfg.batch_size, device)
    fake_features = M.batched(feature_net, fake, cfg.batch_size, device)
    results: dict[str, Any] = M.distribution_metrics(real_features, fake_features, cfg.metrics, cfg.seed)
    results.update(class_metrics(classifier, reals, fake, cfg, device))
    if requested is not None:  # cond_accuracy: obedience to y, not quality; Stacked-MNIST read digit by digit
        predicted = M.predict(classifier, fake, cfg.batch_size, device, per_channel=reals.stacked)
        results["cond_accuracy"] = float((predicted == requested).float().mean())
        if cfg.class_id is None:
            results.update(intra_fid(real_features, reals.labels, fake_features, requested))
    return results


def intra_fid(real_features: Tensor, real_labels: Tensor, fake_features: Tensor, requested: Tensor) -> dict:
    """Each class's samples against its own held-out images (StudioGAN's intra-class FID)."""
    per_class, needed = {}, max(MIN_PER_CLASS, real_features.size(1) + 1)
    for c in requested.unique().tolist():
        reals, fakes = real_features[real_labels == c], fake_features[requested == c]
        if min(reals.size(0), fakes.size(0)) < needed:
            log.info("Intra-class FID left out: class %d has %d real and %d generated images (< %d).",
                     c, reals.size(0), fakes.size(0), needed)  # fmt: skip
            return {"intra_fid": None}
        per_class[c] = M.fid(reals, fakes)
    values = list(per_class.values())
    return {"intra_fid": sum(values) / len(values), "intra_fid_min": min(values), "intra_fid_max": max(values),
            "intra_fid_per_class": {str(c): round(v, 4) for c, v in per_class.items()}}  # fmt: skip


def draw_pictures(G: nn.Module, fake: Tensor, data: DataConfig, cfg: EvaluateConfig, device: torch.device) -> dict:
    rows, steps, k = cfg.interpolation_rows, cfg.interpolation_steps, cfg.neighbours
    z0, z1 = torch.randn(2, rows, G.z_dim, generator=torch.Generator().manual_seed(cfg.seed + 1))
    z = slerp(z0, z1, torch.linspace(0, 1, steps)).reshape(rows * steps, G.z_dim)
    # conditional G: row r drawn as the class asked for, else as class r (mod the classes)
    y = torch.arange(rows) % max(G.num_classes, 1) if cfg.class_id is None else torch.full((rows,), cfg.class_id)
    y = y.repeat_interleave(steps).to(device) if G.num_classes else None
    # each query, then its k nearest training images (pixel L2); the images in chunks: a streamed dataset need not fit
    training, queries = load_dataset(data, train=True).images, fake[: cfg.neighbour_queries]
    chunks = training.split(4096) if isinstance(training, Tensor) else DataLoader(training, batch_size=4096)
    distance = torch.cat([torch.cdist(queries.float().flatten(1), chunk.float().flatten(1)) for chunk in chunks], 1)
    nearest = distance.topk(k, dim=1, largest=False).indices
    neighbours = torch.stack([training[int(i)] for i in nearest.flatten()]).unflatten(0, nearest.shape)
    pictures = {"samples": image_grid(to_unit_range(fake[: cfg.grid_samples]))}
    pictures["interpolation"] = image_grid(sample(G, z.to(device), y), nrow=steps)
    grid = torch.cat([queries[:, None], neighbours], dim=1).flatten(0, 1)
    pictures["nearest_neighbours"] = image_grid(to_unit_range(grid), nrow=k + 1)
    if G.num_classes and cfg.class_id is None:  # one row per class (at most 16), the same latents in every row
        columns = math.ceil(math.sqrt(cfg.grid_samples))
        latents = torch.randn(columns**2, G.z_dim, generator=torch.Generator().manual_seed(cfg.seed + 2))
        z, y = class_rows(latents, G.num_classes)
        pictures["classes"] = image_grid(sample(G, z.to(device), y.to(device)), nrow=columns)
    return pictures


def slerp(z0: Tensor, z1: Tensor, t: Tensor) -> Tensor:
    """(R, D), (R, D), (T,) -> (R, T, D) (White 2016): latents lie near a sphere; a line cuts inside, unseen by G."""
    u0, u1 = z0 / z0.norm(dim=-1, keepdim=True), z1 / z1.norm(dim=-1, keepdim=True)
    omega = torch.acos((u0 * u1).sum(dim=-1).clamp(-1, 1))[:, None, None]  # (R, 1, 1)
    t, sin = t[None, :, None], torch.sin(omega)  # (1, T, 1), (R, 1, 1)
    near = sin.abs() < 1e-6  # (almost) parallel: the arc is a line
    w0 = torch.where(near, 1 - t, torch.sin((1 - t) * omega) / torch.where(near, 1.0, sin))
    w1 = torch.where(near, t, torch.sin(t * omega) / torch.where(near, 1.0, sin))
    return w0 * z0[:, None] + w1 * z1[:, None]


def data_config_of(state: Mapping[str, Any], overrides: Mapping, source: str = "the checkpoint") -> DataConfig:
    recorded = ckpt.stored_config(state["config"], source, "data")
    for key in ("image_size", "channels"):
        if key in overrides and key in state["config"]["data"] and overrides[key] != getattr(recorded, key):
            what = f"data.{key}={overrides[key]!r} differs from the checkpoint's {getattr(recorded, key)!r}"
            why = "the generator's output shape is fixed by the checkpoint. Leave data.image_size and data.channels out"
            raise ConfigError(f"{what}: {why}.")
    try:  # Hydra has typed the overrides against DataConfig already: a failure here is theirs
        data = OmegaConf.to_object(OmegaConf.merge(recorded, dict(overrides)))
    except (OmegaConfBaseException, ValueError) as err:
        key = getattr(err, "full_key", "") or "?"
        raise ConfigError(f"data.{key}: {str(err).splitlines()[0]}. Fix or drop that override.") from err
    data.check()
    return data


def classes_of(state: Mapping[str, Any], source: str = "the checkpoint") -> int:
    """G's classes (0: unconditional); CheckpointError when model.conditional and num_classes disagree."""
    conditional, num_classes = ckpt.stored_config(state["config"], source, "model").conditional, state["num_classes"]
    if (conditional and num_classes >= 2) or (not conditional and num_classes == 0):
        return num_classes
    built = f"built for {num_classes} classes" if num_classes else "built without classes (num_classes 0 or absent)"
    file, needs = ckpt.checkpoint_path(source), ", and a conditional one needs 2 or more" if conditional else ""
    why = f"model.conditional={str(conditional).lower()}, but its entry 'num_classes' says its generator was {built}"
    instead = ckpt.another_checkpoint(file, "evaluate")
    raise CheckpointError(f"The config stored in {file} and its weights disagree: {why}{needs}. {DAMAGED} {instead}")


def build_generator(
    state: Mapping[str, Any], use_ema: bool, device: torch.device, source: str = "the checkpoint"
) -> tuple[Generator, str]:
    """EMA weights when asked and present. A NaN or inf weight is refused: FID would still be finite."""
    model, data = (ckpt.stored_config(state["config"], source, group) for group in ("model", "data"))
    G = Generator(model.z_dim, model.g_width, data.channels, data.image_size, classes_of(state, source))
    instead = ckpt.another_checkpoint(ckpt.checkpoint_path(source), "evaluate")
    name, weights = "raw", state["G"]
    if use_ema and state.get("G_ema") is None:  # a state dict or None: load_checkpoint checked it
        log.info("The checkpoint holds no EMA generator; sampling from G itself.")
    elif use_ema:  # AveragedModel's state dict: the averaged network's entries under module.
        name, ema = "EMA", state["G_ema"]
        weights = {k.removeprefix("module."): v for k, v in ema.items() if k.startswith("module.")}
    why = f"The generator is built from the config stored in {ckpt.checkpoint_path(source)}: its config and weights"
    ckpt.load_module_state(G, weights, f"{name} generator", f"{why} disagree. {DAMAGED} {instead}")
    bad, total = ckpt.nonfinite(G.state_dict().items())  # the check a resume makes too (require_training_state)
    if bad:
        shown = ", ".join(bad[:4]) + (", ..." if len(bad) > 4 else "")
        why = f"{len(bad)} of its {total} tensors ({shown}): the checkpoint is damaged (training diverged, or altered)"
        raise CheckpointError(f"The {name} generator in {source} holds NaN or inf in {why}. {instead}")
    return G.to(device).eval(), name


def recompute_batchnorm_stats(G: nn.Module, batches: int, batch_size: int, seed: int, device: torch.device) -> bool:
    """The EMA's averaged running statistics are not those of the averaged weights: update_bn (SWA's fix)."""
    if batches == 0 or not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in G.modules()):
        return False
    latents = torch.Generator(device).manual_seed(seed + 1)
    inputs = [torch.randn(batch_size, G.z_dim, device=device, generator=latents) for _ in range(batches)]
    if G.num_classes:  # classes drawn uniformly, as a last column a pre-hook splits off (update_bn passes one input)
        classes = [torch.randint(G.num_classes, (batch_size, 1), device=device, generator=latents) for _ in inputs]
        inputs = [torch.cat([z, y.to(z.dtype)], dim=1) for z, y in zip(inputs, classes)]
    with G.register_forward_pre_hook(lambda _, zy: (zy[0][:, :-1], zy[0][:, -1].long()) if G.num_classes else None):
        update_bn(inputs, G, device)  # under no_grad; leaves G in the mode it found it in (eval)
    return True


def reference_subset(
    reference: ImageSet, count: int, seed: int, split: str = "held-out split", setting: str = "num_samples"
) -> tuple[Tensor, Tensor]:
    total = reference.labels.numel()
    if total < count:
        log.warning(f"The {split} has {total} images, fewer than {setting}={count}: the metrics compare {count} "
                    f"samples with {total} real images.")  # fmt: skip
    shuffled = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    index = torch.arange(total) if total < count else shuffled[:count]
    return take(reference.images, index), reference.labels[index]


def classifier_for(
    data: DataConfig, reference: ImageSet, stacked: bool, cfg: EvaluateConfig, device: torch.device
) -> tuple[Optional[M.Classifier], Optional[float], Optional[str]]:
    """Classifier, accuracy, and file name with a hash (numbers compare only under the same file)."""
    if reference.num_classes >= 2:
        classifier, accuracy, path = M.load_or_train_classifier(classifier_data(data, stacked), cfg.metrics.classifier,
                                                                device)  # fmt: skip
        digest = hashlib.sha1(path.read_bytes()).hexdigest()[:10] if path.is_file() else "not cached"
        return classifier, accuracy, f"{path.name} (sha1 {digest})"
    if cfg.metrics.features == FeatureSpace.classifier:
        raise MetricsError(f"data={data.name} has no class labels (1 class): classifier features need them. "
                           "Use metrics.features=inception.")  # fmt: skip
    return None, None, None


def classifier_data(data: DataConfig, stacked: bool) -> DataConfig:
    """Stacked-MNIST: the grayscale source, one channel at a time."""
    return dataclasses.replace(data, name=data.source, channels=1) if stacked else data


def to_uint8(images: Tensor) -> Tensor:  # the pixels a saved PNG would hold
    return images.add(1).mul_(127.5).round_().clamp_(0, 255).to(torch.uint8)


def generate(
    G: nn.Module, count: int, batch_size: int, seed: int, device: torch.device, labels: Optional[Tensor] = None
) -> Tensor:
    """uint8 on the CPU; eval() so that a sample does not depend on its batch."""
    latents, chunks = torch.Generator(device).manual_seed(seed), []
    for start in range(0, count, batch_size):
        z = torch.randn(min(batch_size, count - start), G.z_dim, device=device, generator=latents)
        y = None if labels is None else labels[start : start + z.size(0)].to(device)  # the classes asked for
        chunks.append(to_uint8(sample(G, z, y)).cpu())
    return torch.cat(chunks)


def class_metrics(
    classifier: Optional[M.Classifier], reals: Reals, fake: Tensor, cfg: EvaluateConfig, device: torch.device
) -> dict[str, Any]:
    """Stacked data: over every channel's digits pooled, plus the 1000 digit triples' modes."""
    if classifier is None:
        return {"classes_covered": None, "class_kl": None}
    batch, threshold, stacked = cfg.batch_size, cfg.metrics.class_threshold, reals.stacked
    fake_modes = M.predict(classifier, fake, batch, device, per_channel=stacked)
    real_modes = M.predict(classifier, reals.images, batch, device, per_channel=stacked)
    if not stacked:
        return M.class_coverage(fake_modes, real_modes, classifier.head.out_features, threshold)
    decoded = float((real_modes == reals.labels).float().mean())
    log.info(f"Stacked data: the channel classifier reads {100 * decoded:.1f}% of the held-out digit triples right "
             f"({int(real_modes.unique().numel())} of 1000 modes present among them)")  # fmt: skip
    if decoded < 0.5:
        log.warning("Fewer than half of the held-out triples decode to their labels: the channel order or the "
                    "source classifier does not match the stacked data; modes are unreliable.")  # fmt: skip
    fake_digits, real_digits = torch.cat(M.mode_digits(fake_modes)), torch.cat(M.mode_digits(real_modes))
    return {**M.class_coverage(fake_digits, real_digits, 10, threshold), **M.mode_coverage(fake_modes, 1000)}


def write_samples(fake: Tensor, npz: Optional[Path] = None, pngs: Optional[Path] = None) -> None:
    """npz: uint8 (N, H, W, C) under `arr_0`, as metric tools read it, written last (so all PNGs precede it)."""
    images = fake.permute(0, 2, 3, 1).numpy()
    if pngs is not None:
        pngs.mkdir(exist_ok=True)
        for i, image in enumerate(images):
            Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(pngs / f"{i:06d}.png")
    if npz is not None:
        np.savez_compressed(npz, images)


def interrupted(run_dir: Path) -> str:
    """The last line of an interrupted evaluation: metrics.json comes after all else but TensorBoard's events."""
    run = Run(run_dir)
    if run.metrics.is_file():
        return f"Interrupted (SIGINT) after the metrics were saved to {run.metrics}; the events in {run.tb} may be cut."
    names = [path.name for path in run_dir.iterdir()] if run_dir.is_dir() else []
    outputs = sorted(name for name in names if not name.startswith(".") and not name.endswith(".log"))
    partial = f", only partial outputs ({', '.join(outputs)})" if outputs else ""
    return f"Interrupted (SIGINT); nothing measured was saved: {run_dir} holds no metrics.json{partial}."


def check_class_id(class_id: Optional[int], num_classes: int, source: str) -> None:
    if class_id is not None and not num_classes:
        what = f"{source} holds an unconditional generator, which cannot be told a class"
        todo = "Leave class_id out, or use a checkpoint of a run with model.conditional=true"
        raise ConfigError(f"class_id={class_id} asks for one class, but {what}. {todo}.")
    if class_id is not None and not 0 <= class_id < num_classes:
        raise ConfigError(f"class_id={class_id} is out of range: the generator in {source} knows 0-{num_classes - 1}.")


# G as a file that runs without this project's code: TorchScript, torch.export (control flow: docs/more.md) ----
TORCHSCRIPT_FILE, EXPORT_FILE = "generator.torchscript.pt", "generator.pt2"


class SamplingGenerator(nn.Module):
    def __init__(self, G: nn.Module):
        super().__init__()
        self.G = copy.deepcopy(G).cpu().to(memory_format=torch.contiguous_format).eval()
        self.z_dim: int = G.z_dim

    def forward(self, z: Tensor) -> Tensor:  # control flow on the input's rank, which trace does not record
        return self.G(z.unsqueeze(0)).squeeze(0) if z.dim() == 1 else self.G(z)


def save_generator(G: nn.Module, formats: ExportFormat, out_dir: Path) -> list[Path]:
    """Reload with `torch.jit.load(path)` or `torch.export.load(path).module()`; both need only torch."""
    out_dir.mkdir(parents=True, exist_ok=True)
    wrapped, written = SamplingGenerator(G), []
    if formats in (ExportFormat.torchscript, ExportFormat.both):
        with warnings.catch_warnings():  # torch 2.x deprecates TorchScript (FutureWarning); shown for contrast
            warnings.simplefilter("ignore", FutureWarning)
            torch.jit.script(wrapped).save(str(out_dir / TORCHSCRIPT_FILE))  # script keeps the rank-1 branch
        written.append(out_dir / TORCHSCRIPT_FILE)
    if formats in (ExportFormat.export, ExportFormat.both):
        # a dynamic batch, from an example of 2 (torch.export specialises sizes 0 and 1); the rank-1 branch guarded out
        program = torch.export.export(wrapped, (torch.zeros(2, G.z_dim),), dynamic_shapes=({0: Dim("batch", min=1)},))
        torch.export.save(program, str(out_dir / EXPORT_FILE))
        written.append(out_dir / EXPORT_FILE)
    return written
