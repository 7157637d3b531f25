"""Conditional generation, DiffAugment and the overfitting signals (issue 20), in training and in evaluate.py."""

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import compose_config, tiny_checkpoint
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_steps import BCE, adam, batch
from torch import nn

from gan.checkpoint import load_checkpoint
from gan.config import ConfigError, EvaluateConfig, MetricsConfig
from gan.core import augment as A
from gan.core.models import Discriminator, Generator
from gan.core.sampling import class_rows
from gan.core.steps import StepContext, d_step, g_step
from gan.data import BatchStream, load_dataset
from gan.errors import MetricsError
from gan.evaluation import metrics as M
from gan.evaluation import pipeline as P
from gan.evaluation.pipeline import evaluate
from gan.training import train
from gan.training.loop import OverfitProbe
from gan.training.monitor import FAKE_TAG, REAL_TAG, class_images, labelled_rows

ALL = ("color", "translation", "cutout")


@pytest.fixture
def conditional_gan() -> tuple[Generator, Discriminator]:
    torch.manual_seed(0)
    G = Generator(z_dim=16, width=8, channels=1, image_size=16, num_classes=10)
    return G, Discriminator(width=8, channels=1, image_size=16, num_classes=10)


def labelled_batch(G: Generator, n: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    real, y = torch.rand(n, 1, 16, 16) * 2 - 1, torch.randint(0, 10, (n,))
    return real, y, G(torch.randn(n, 16), y)


def augmenting(*policies: str) -> StepContext:
    return StepContext(augment=lambda x: A.diff_augment(x, policies))


def test_unconditional_models_have_no_class_module_and_refuse_nothing_new():
    G, D = Generator(z_dim=16, width=8, image_size=16), Discriminator(width=8, image_size=16)
    assert G.net[0].in_channels == 16 and D.embed is None  # z alone in; no class embedding in D
    assert not any("embed" in key for key in D.state_dict())  # old checkpoints load
    assert D(torch.randn(4, 1, 16, 16)).shape == (4,)


def test_projection_discriminator_adds_the_class_embedding_dot_the_features(conditional_gan):
    _, D = conditional_gan
    x, y = torch.randn(4, 1, 16, 16), torch.tensor([0, 3, 3, 9])
    logits, features = D(x, y, with_features=True)
    psi = D.head(features).flatten()  # DCGAN's own head: psi(phi(x))
    projection = (D.embed.weight[y] * features.flatten(1)).sum(dim=1)  # <embed(y), phi(x)>
    torch.testing.assert_close(logits, psi + projection)
    assert not torch.allclose(D(x, torch.tensor([1, 1, 1, 1])), logits)  # the class changes the score


def test_conditional_generator_draws_each_class_from_the_same_latents_one_class_per_row(conditional_gan):
    G, _ = conditional_gan
    z = torch.randn(64, 16)
    rows_z, rows_y = class_rows(z, num_classes=10)
    assert rows_z.shape == (80, 16) and rows_y.tolist() == [c for c in range(10) for _ in range(8)]
    assert torch.equal(rows_z[:8], rows_z[8:16]) and torch.equal(rows_z[:8], z[:8])
    assert class_rows(z, num_classes=1000)[1].unique().numel() == 16  # at most 16 rows, spread out
    images = G.eval()(rows_z, rows_y)
    assert images.shape == (80, 1, 16, 16) and not torch.allclose(images[0], images[8])  # one latent, two classes
    pytest.raises(ValueError, lambda: G(z)).match(r"G\(z, y\)")


@pytest.mark.parametrize("augmented", [False, True], ids=["plain", "augmented"])
def test_d_step_with_labels_leaves_every_generator_gradient_none(conditional_gan, augmented):
    G, D = conditional_gan
    real, y, fake = labelled_batch(G)
    d_before = [p.detach().clone() for p in D.parameters()]
    d_step(D, adam(D), real, fake, *([augmenting(*ALL)] if augmented else []), y=y)
    assert all(p.grad is None for p in G.parameters())  # the weights that read the class too
    assert not torch.equal(d_before[-1], D.embed.weight)  # D's class embedding did learn


def test_without_detach_the_d_loss_reaches_the_generator_class_weights(conditional_gan):
    G, D = conditional_gan
    real, y, fake = labelled_batch(G)
    BCE.d(D(real, y), D(fake, y)).backward()  # d_step without .detach()
    assert G.net[0].weight.grad[G.z_dim :][y].abs().sum() > 0


def test_g_step_with_labels_leaves_D_untouched_and_teaches_G_the_classes_in_the_batch(conditional_gan):
    G, D = conditional_gan
    real, y, fake = labelled_batch(G)
    _, features = d_step(D, adam(D), real, fake.detach(), y=y)
    d_before = [p.detach().clone() for p in D.parameters()]
    codes = G.net[0].weight[G.z_dim :]  # the weights that read the one-hot class code (a view: it follows G's updates)
    class_before = codes.detach().clone()
    g_step(D, G, adam(G), fake, features, y=y)
    assert all(p.grad is None for p in D.parameters())
    assert all(torch.equal(a, b) for a, b in zip(d_before, D.parameters()))
    assert all(p.requires_grad for p in D.parameters())
    changed = (codes != class_before).flatten(1).any(dim=1)  # first step: Adam moves what has gradient
    assert changed[y].all() and not changed[[c for c in range(10) if c not in y.tolist()]].any()


@pytest.mark.parametrize("policy", ["brightness", "saturation", "contrast", "translation", "cutout"])
def test_each_augmentation_passes_gradient_back_to_its_input(policy):
    x = torch.randn(4, 3, 16, 16, requires_grad=True)
    getattr(A, policy)(x, torch.Generator().manual_seed(0)).square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_translation_shifts_by_up_to_an_eighth_cutout_zeroes_up_to_a_quarter_and_a_seed_repeats_them():
    x = torch.arange(2 * 16 * 16, dtype=torch.float32).view(2, 1, 16, 16) + 1
    out = A.translation(x, torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)  # the same draws, in the same order
    shift_rows, shift_cols = (torch.randint(-2, 3, (2, 1, 1), generator=gen) for _ in range(2))
    assert {int(s) for s in torch.cat([shift_rows, shift_cols]).flatten()} != {0}  # a real shift happens
    padded = nn.functional.pad(x, (2, 2, 2, 2))  # out[r, c] = x[r + dx, c + dy], 0 beyond the edges
    for i in range(2):
        dx, dy = int(shift_rows[i]) + 2, int(shift_cols[i]) + 2
        torch.testing.assert_close(out[i, 0], padded[i, 0, dx : dx + 16, dy : dy + 16])
    # cutout zeroes at most a square of half the side
    out = A.cutout(torch.ones(64, 1, 16, 16), torch.Generator().manual_seed(0))
    zeros = (out == 0).flatten(1).sum(dim=1)
    assert (zeros > 0).all() and (zeros <= 8 * 8).all() and (zeros == 64).any()
    # the same generator state draws the same augmentation
    x = torch.randn(8, 3, 16, 16)
    first = A.diff_augment(x, ALL, torch.Generator().manual_seed(1))
    assert torch.equal(first, A.diff_augment(x, ALL, torch.Generator().manual_seed(1)))
    assert not torch.equal(first, A.diff_augment(x, ALL, torch.Generator().manual_seed(2)))
    assert A.diff_augment(x, ()) is x and A.no_augment(x) is x


def d_then_g(tiny_gan: tuple[Generator, Discriminator], ctx: StepContext) -> tuple[torch.Tensor, dict]:
    """A d_step then a g_step of the tiny pair on a random batch, both through `ctx`: the fake batch, G's stats."""
    G, D = tiny_gan
    real, fake = batch(G)
    _, features = d_step(D, adam(D), real, fake, ctx)
    return fake, g_step(D, G, adam(G), fake, features, ctx)


def test_g_step_sends_G_gradient_through_the_augmentation(tiny_gan):
    seen = []
    for p in tiny_gan[0].parameters():  # d_step detaches the fakes: only g_step reaches G
        p.register_hook(lambda grad: seen.append(grad.norm()))
    fake, stats = d_then_g(tiny_gan, augmenting(*ALL))
    assert len(seen) == len(list(tiny_gan[0].parameters())) and all(norm > 0 for norm in seen)
    assert stats["grad_norm/g"] > 0 and fake.grad.abs().sum() > 0


def test_with_cutout_alone_the_pixels_D_never_saw_get_no_gradient(tiny_gan):
    fake, _ = d_then_g(tiny_gan, augmenting("cutout"))
    cut = (fake.grad == 0).flatten(1).float().mean(dim=1)  # the gradient is the cutout mask's shadow
    assert (cut > 0).all() and (cut <= 0.25).all()


def test_an_augmentation_of_pixels_rounded_to_uint8_would_give_G_no_gradient(tiny_gan):
    def as_a_data_loader_would(x: torch.Tensor) -> torch.Tensor:  # augment uint8 pixels: round() has gradient 0
        pixels = x.add(1).mul(127.5).round()
        return A.translation(pixels.div(127.5).sub(1))

    fake, stats = d_then_g(tiny_gan, StepContext(augment=as_a_data_loader_would))
    assert stats["grad_norm/g"] == 0 and fake.grad.abs().sum() == 0


def test_r_t_is_the_mean_sign_of_D_on_the_real_batch(tiny_gan):
    G, D = tiny_gan
    real, fake = batch(G)
    expected = D(real).sign().mean()  # D before its update, as d_step's forward sees it
    stats, _ = d_step(D, adam(D), real, fake)
    torch.testing.assert_close(stats["d/overfit_rt"], expected)


def test_the_new_keys_reach_the_typed_config():  # an unknown policy: test_config's Hydra refusals
    cfg = compose_config()
    assert not cfg.model.conditional and cfg.trainer.overfit_every == 500
    # adaptive DiffAugment on by default (docs/results.md, "Training longer"); the paper's recipe has none
    assert [p.value for p in cfg.model.diffaugment] == ["color", "translation", "cutout"]
    assert cfg.model.ada_target == 0.6 and compose_config("experiment=paper").model.diffaugment == []
    cfg = compose_config("model.conditional=true", "model.diffaugment=[translation,color]")
    assert cfg.model.conditional and [p.value for p in cfg.model.diffaugment] == ["translation", "color"]


def test_conditional_on_a_flat_folder_is_refused_naming_model_conditional(tmp_path):
    (tmp_path / "flat").mkdir()
    for i in range(48):
        Image.new("L", (16, 16), color=i * 5).save(tmp_path / "flat" / f"{i:03d}.png")
    cfg = compose_config("data=folder", f"data.root={tmp_path / 'flat'}", "model.conditional=true")
    with pytest.raises(ConfigError, match=re.escape(f"needs class labels, and data=folder in {tmp_path / 'flat'}")):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_real_grid_of_a_conditional_run_has_a_row_per_class_of_its_images_labelled_in_a_margin():
    """Each row of the real grid holds images of the class the fake grid's row shows, different ones."""
    labels = torch.tensor([2, 0, 1, 0, 2, 1, 0, 2])
    images = torch.arange(8, dtype=torch.uint8).view(8, 1, 1, 1).expand(8, 1, 4, 4).contiguous()  # pixel = index
    stream = BatchStream(images, batch_size=2, seed=0, device=torch.device("cpu"), labels=labels)
    classes = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])  # three rows of three, as class_rows lays them out
    chosen = class_images(stream, labels, classes)[:, 0, 0, 0].long()
    assert labels[chosen].tolist() == classes.tolist()
    assert chosen.tolist() == [1, 3, 6, 2, 5, 2, 0, 4, 7]  # the k-th image of the class; class 1 has two
    # the class labels are written in a margin left of the grid
    grid = torch.zeros(3, 2 * 18 + 2, 3 * 18 + 2)
    labelled = labelled_rows(grid, ["0", "17"])
    width = labelled.shape[2] - grid.shape[2]
    assert labelled.shape[:2] == grid.shape[:2] and width > 6
    margin, half = labelled[:, :, :width], grid.shape[1] // 2
    assert margin[:, :half].amax() > 0.5 and margin[:, half:].amax() > 0.5  # a label in each row's height
    assert torch.equal(labelled[:, :, width:], grid)  # the grid itself untouched
    assert labelled_rows(grid, ["0", "1"]).shape[2] < labelled.shape[2]  # the margin fits the longest label


def assert_same_weights(run: Path, other: Path, entries: tuple[str, ...]) -> None:
    a, b = load_checkpoint(run), load_checkpoint(other)
    for key in entries:
        for name, value in a[key].items():
            assert torch.equal(value, b[key][name]), f"{key}.{name} differs"


def test_a_conditional_augmented_run_resumes_bit_identically(tmp_path):
    """Bit for bit with the overfitting probe on; the straight run records its classes and logs the signals."""
    common = ("model.conditional=true", "model.diffaugment=[color,translation,cutout]", "trainer.overfit_every=3")
    straight = compose_config("trainer.max_steps=10", "trainer.checkpoint_every=100", *common)
    result = train(straight, tmp_path / "straight")
    train(compose_config("trainer.max_steps=5", *common), tmp_path / "split")
    train(compose_config("trainer.max_steps=10", f"trainer.resume={tmp_path / 'split'}", *common), tmp_path / "split")
    assert_same_weights(tmp_path / "straight", tmp_path / "split", ("G", "D", "G_ema"))
    assert result.step == 10 and -1 <= result.metrics["train/d_overfit_rt"] <= 1
    state = load_checkpoint(tmp_path / "straight")
    assert state["num_classes"] == 10 and state["G"]["net.0.weight"].shape[0] == straight.model.z_dim + 10
    assert state["config"]["model"]["diffaugment"] == list(ALL)
    events = EventAccumulator(str(tmp_path / "straight" / "tb"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/d_overfit_rt", "train/d_score_train", "train/d_score_heldout", "train/d_heldout_gap"} <= tags
    assert [e.step for e in events.Scalars("train/d_heldout_gap")] == [3, 6, 9]
    grid, real = events.Images(FAKE_TAG)[-1], events.Images(REAL_TAG)[0]
    # 16 fixed latents: 4 per class row, 10 rows, and a margin at the left for the class labels
    assert grid.width > 4 * 18 + 2 and grid.height == 10 * 18 + 2
    assert (real.width, real.height) == (grid.width, grid.height)  # the real grid in the same layout


def test_the_overfitting_probe_changes_nothing_of_the_run(tmp_path):
    off = train(compose_config("trainer.overfit_every=0"), tmp_path / "off")
    on = train(compose_config("trainer.overfit_every=1"), tmp_path / "on")
    assert off.metrics["loss/d"] == on.metrics["loss/d"]
    assert_same_weights(tmp_path / "off", tmp_path / "on", ("G", "D"))


def test_the_probe_restores_D_buffers_and_draws_no_random_number(tiny_gan):
    _, D = tiny_gan
    images = torch.randint(0, 256, (64, 1, 16, 16), dtype=torch.uint8)
    probe = OverfitProbe((images[:32], None), (images[32:], None), batch_size=16)
    buffers, rng = [b.clone() for b in D.buffers()], torch.get_rng_state()
    scores = probe.measure(D, StepContext())
    assert all(torch.equal(a, b) for a, b in zip(buffers, D.buffers())) and torch.equal(rng, torch.get_rng_state())
    assert scores["d/heldout_gap"] == pytest.approx(scores["d/score_train"] - scores["d/score_heldout"])


def test_evaluate_reports_cond_accuracy_a_row_per_class_and_given_class_id_measures_that_class_alone(
    tmp_path, monkeypatch, one_thread, classifier_cache
):
    """An untrained conditional G on 16 px digits (1200 training, 200 held-out images): every class, then class 7."""
    checkpoint, metrics = tiny_checkpoint(tmp_path, "model.conditional=true"), MetricsConfig(kid_subsets=10)
    cfg = EvaluateConfig(checkpoint=str(checkpoint), num_samples=200, threads=1, device="cpu", metrics=metrics)
    cfg.check()
    data = {"root": str(classifier_cache.parent)}
    results = evaluate(cfg, tmp_path / "eval", data)
    assert 0 <= results["cond_accuracy"] <= 1 and results["num_classes"] == 10 and results["class_id"] is None
    assert results["intra_fid"] is None  # 20 held-out images a class: too few for a per-class FID
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["cond_accuracy"] == results["cond_accuracy"]
    with Image.open(tmp_path / "eval" / "classes.png") as grid:
        assert grid.size == (8 * 18 + 2, 10 * 18 + 2)
    drawn, measure = [], P.measure

    def recorded(*args, **kwargs):  # the real measurement, with its classifier, samples and their classes noted
        drawn.append(args)
        return measure(*args, **kwargs)

    monkeypatch.setattr(P, "measure", recorded)
    cfg.class_id, cfg.metrics.pr_k, cfg.metrics.dc_k = 7, 3, 3  # about 20 held-out images of class 7
    cfg.check()
    results = evaluate(cfg, tmp_path / "seven", data)
    held_out = load_dataset(P.data_config_of(load_checkpoint(cfg.checkpoint), {}), train=False)
    assert results["class_id"] == 7 and results["num_real"] == int((held_out.labels == 7).sum())
    (_, classifier, _, fake, _, _, requested) = drawn[0]
    assert (requested == 7).all() and requested.numel() == 200
    obeyed = float((M.predict(classifier, fake, 64, torch.device("cpu")) == 7).float().mean())  # obedience to y
    assert results["cond_accuracy"] == obeyed and "intra_fid" not in results  # one class: no spread
    assert not (tmp_path / "seven" / "classes.png").exists()
    cfg.metrics.dc_k = results["num_real"]  # each image's ball would need more neighbours than the class holds
    with pytest.raises(MetricsError, match=f"class_id=7: .* holds {results['num_real']}"):
        evaluate(cfg, tmp_path / "again", data)


def test_intra_class_fid_is_each_class_against_its_own_held_out_images(monkeypatch):
    monkeypatch.setattr(P, "MIN_PER_CLASS", 10)  # and 4 features: 50 images a class are enough
    gen = torch.Generator().manual_seed(0)
    real = torch.cat([torch.randn(50, 4, generator=gen) + 3 * c for c in range(2)])
    labels = torch.arange(2).repeat_interleave(50)
    right, swapped = P.intra_fid(real, labels, real, labels), P.intra_fid(real, labels, real, 1 - labels)
    assert right["intra_fid"] < 1e-3 < swapped["intra_fid"]  # same images, wrong classes: far apart
    assert set(right["intra_fid_per_class"]) == {"0", "1"}
    assert P.intra_fid(real, labels, real[:55], labels[:55])["intra_fid"] is None  # 5 of class 1: too few
