"""Training longer never loses the good generator: best.pt, the D-won alarm, ADA, and the periodic extras."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import compose_config, output_of, run_train
from test_checkpoints import assert_same_state, stop_at
from test_watching import events_of, tb_group_order

from gan.checkpoint import FORMAT, load_checkpoint, require_training_state, stored_config
from gan.config import EvaluateConfig, to_plain
from gan.core.augment import AdaptiveAugment, diff_augment
from gan.core.losses import LOSSES
from gan.data import load_dataset
from gan.errors import CheckpointError, ConfigError
from gan.evaluation import metrics as M
from gan.evaluation.pipeline import prepare_generator, reference_subset
from gan.training import loop, train


def test_extras_run_in_order_at_their_cadence_and_at_the_end():
    ran: list[tuple[str, int]] = []
    note = lambda name: lambda tick: ran.append((name, tick.step))  # noqa: E731
    tasks = [loop.Every("2", 2, note("2")), loop.Every("3, at end", 3, note("3, at end"), at_end=True)]
    extras = loop.Extras([*tasks, loop.Every("off", 0, note("off"), at_end=True)])
    for step in range(1, 6):
        extras.after_step(loop.Tick(step, {}), done=step == 5)
    assert ran == [("2", 2), ("3, at end", 3), ("2", 4), ("3, at end", 5)]  # 0 = never, even at the end


def scripted(monkeypatch, fids: list[float]) -> None:  # QualityProbe replaced by one whose FIDs are given in advance
    left = iter(fids)
    probe = SimpleNamespace(measure=lambda G: {loop.FID_TAG: next(left), "quality/recall": 0.5})
    monkeypatch.setattr("gan.training.loop.QualityProbe", lambda *args, **kwargs: probe)


def test_best_pt_holds_the_generator_of_the_lowest_fid_and_is_what_evaluate_reads(tmp_path, monkeypatch):
    scripted(monkeypatch, [9.0, 4.0, 4.0])  # measured at steps 2, 4, 6: the best is step 4's (a tie keeps it)
    common = ("trainer.eval_every=2", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=3")
    result = train(compose_config(*common), tmp_path)
    best = load_checkpoint(tmp_path / "checkpoints" / "best.pt")
    assert best["kind"] == "best" and best["step"] == 4 and best["metrics"][loop.FID_TAG] == 4.0
    assert result.best == {"fid": 4.0, "step": 4}
    # the weights are the step-4 ones: those of the numbered checkpoint written at step 4
    at_4, last = load_checkpoint(tmp_path / "checkpoints" / "step_000004.pt"), load_checkpoint(tmp_path)
    assert all(torch.equal(best["G_ema"][key], value) for key, value in at_4["G_ema"].items())
    assert any(not torch.equal(best["G_ema"][key], value) for key, value in last["G_ema"].items())  # not step 6's
    assert last["best"] == {"fid": 4.0, "step": 4}  # last.pt records it, so a resume knows what to beat
    cfg = EvaluateConfig(checkpoint=str(tmp_path / "checkpoints" / "best.pt"), bn_batches=1, batch_size=8)
    G, about = prepare_generator(best, cfg, torch.device("cpu"))
    assert about["step"] == 4 and about["generator"].startswith("EMA") and G(torch.randn(2, G.z_dim)).shape[-1] == 16
    with pytest.raises(CheckpointError, match="is a best.pt: G alone.* Resume from the run's last.pt"):
        require_training_state(best, cfg.checkpoint)  # no D nor optimizers: trainer.resume refuses it
    scripted(monkeypatch, [7.0, 2.0])  # resumed: step 8 is worse (kept out), step 10 better (kept)
    seen = []
    result = train(compose_config(*common, "trainer.max_steps=10", f"trainer.resume={tmp_path}"), tmp_path,
                   after_step=lambda state: seen.append(dict(state.best)) and False)  # fmt: skip
    assert seen[0] == seen[1] == {"fid": 4.0, "step": 4}  # restored from last.pt, and kept after step 8's worse FID
    assert result.best == {"fid": 2.0, "step": 10} == load_checkpoint(tmp_path)["best"]
    assert load_checkpoint(tmp_path / "checkpoints" / "best.pt")["step"] == 10


def test_the_final_log_line_names_last_and_best(tmp_path, monkeypatch):
    untrained = M.Classifier(1, 10, width=4, feature_dim=8)  # a classifier below evaluate.py's bar
    monkeypatch.setattr(M, "train_classifier", lambda *args: (untrained, 0.5))
    measured = ("trainer.eval_every=3", "trainer.eval_samples=64", f"data.root={tmp_path / 'data'}",
                "model.conditional=true")  # fmt: skip
    result = run_train(f"hydra.run.dir={tmp_path / 'run'}", *measured)
    assert result.returncode == 0, result.stderr[-2000:]
    output = output_of(result)
    done = [line for line in output.splitlines() if "Done:" in line][-1]
    assert all(word in done for word in ("last.pt", "best.pt", "in-training FID"))
    assert "below evaluate.py's bar" in output  # the in-training FID uses it all the same, with a warning
    assert loop.BEST_FID_TAG in events_of(tmp_path / "run" / "tb").Tags()["scalars"]
    best = load_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt")  # a conditional run's quality, its best
    assert best["num_classes"] == 10 and loop.FID_TAG in best["metrics"]


def test_the_validation_images_come_from_the_training_split():
    data = compose_config().data
    training, held_out = load_dataset(data), load_dataset(data, train=False)
    images, labels = reference_subset(training, 50, seed=0)  # what QualityProbe draws its reals with
    assert images.shape == (50, *training.images.shape[1:]) and labels.shape == (50,)
    rows = {bytes(image.numpy()) for image in training.images}
    assert all(bytes(image.numpy()) in rows for image in images)
    assert not any(torch.equal(image, other) for image in images[:10] for other in held_out.images)
    assert torch.equal(images, reference_subset(training, 50, seed=0)[0])  # the same at every measurement of a run


def test_the_alarm_needs_a_whole_window_of_dominance_and_warns_once_per_episode():
    alarms: list[int] = []
    alarm, fake, rt = loop.DWonWatch(100, 10, lambda step, _: alarms.append(step)), "loss/D(G(z))", loop.RT_TAG
    for step in range(10, 100, 10):  # nine points: the window (ten) is not yet full, train/d_won is 0
        assert alarm.observe(step, {fake: 0.001, rt: 1.0}) == {loop.WON_TAG: 0.0}
    # the alarm's own tag at the step it fires, so its card reads that step (a healthy run never writes it)
    assert alarm.observe(100, {fake: 0.001, rt: 1.0}) == {loop.WON_TAG: 1.0, loop.ALARM_TAG: 1.0}
    assert alarm.observe(110, {fake: 0.001, rt: 1.0}) == {loop.WON_TAG: 1.0}
    assert alarms == [100]  # one warning, not one per log point
    for step in range(120, 220, 10):  # D loses its grip: the alarm re-arms
        alarm.observe(step, {fake: 0.3, rt: 0.6})
    assert alarm.observe(220, {fake: 0.3, rt: 0.6}) == {loop.WON_TAG: 0.0}
    for step in range(230, 340, 10):
        alarm.observe(step, {fake: 0.001, rt: 1.0})
    assert alarms == [100, 310]  # nine of ten points at 0.001: the window's mean is 0.031
    # a hinge D's scores are read through a sigmoid: a window of -4 (D(G(z)) 0.018) sets the alarm off too
    scores = LOSSES["hinge"].scores(torch.tensor([3.0, 5.0]), torch.tensor([-4.0, -4.0]))
    assert float(scores["d/fake"]) == pytest.approx(float(torch.sigmoid(torch.tensor(-4.0))))
    assert float(scores["d/fake"]) < loop.FAKE_BELOW
    assert float(scores["d/fake_score"]) == -4.0 and float(scores["d/real_score"]) == 4.0


@pytest.mark.parametrize(
    "fakes, rt, won",
    [
        ([loop.FAKE_BELOW * 0.9] * 10, loop.RT_ABOVE + 0.05, True),
        ([loop.FAKE_BELOW * 1.1] * 10, 1.0, False),  # D still gives the fakes a chance
        ([0.001] * 10, loop.RT_ABOVE - 0.05, False),  # D unsure of the reals
        ([0.2] * 9 + [0.0001], 1.0, False),  # nor does one bad batch make one
    ],
)
def test_the_alarm_needs_both_signs_of_dominance_over_the_window(fakes, rt, won):
    alarms: list[int] = []
    alarm = loop.DWonWatch(100, 10, lambda step, _: alarms.append(step))
    for i, fake in enumerate(fakes):
        result = alarm.observe(10 * (i + 1), {"loss/D(G(z))": fake, loop.RT_TAG: rt})
    assert result == {loop.WON_TAG: float(won), **({loop.ALARM_TAG: 1.0} if won else {})}
    assert alarms == ([100] if won else [])


# G all but frozen, D fast: the tiny run's D wins at step 32 and keeps winning (past step 100)
FORCED = ("optim.lr=1e-9", "optim.lr_d=1e-2", "trainer.log_every=2", "trainer.d_won_window=10")


def test_a_d_that_wins_sets_off_the_alarm_marks_tensorboard_and_on_d_won_stop_ends_the_run_with_exit_code_4(tmp_path):
    # the default, on_d_won=warn, trains on past the alarm: test_watching's d_won screenshot run
    result = run_train(f"hydra.run.dir={tmp_path}", "trainer.max_steps=400", "trainer.on_d_won=stop", *FORCED)
    output = output_of(result)
    assert result.returncode == 4, output[-2000:]
    assert (step := load_checkpoint(tmp_path)["step"]) < 400 and f"Stopped at step {step}" in output
    assert len([line for line in output.splitlines() if "[WARNING] - D has won at step" in line]) == 1
    events = events_of(tmp_path / "tb")
    won = [event.value for event in events.Scalars(loop.WON_TAG)]
    assert won[-1] == 1.0 and 0.0 not in won[won.index(1.0) :]
    assert loop.D_WON_TEXT_TAG in events.Tags()["tensors"]
    # the alarm's card, one point at the step it fired: its group (alarm) sorts before loss, so it opens
    fired = [event.step for event in events.Scalars(loop.WON_TAG) if event.value == 1.0][0]
    assert [(event.step, event.value) for event in events.Scalars(loop.ALARM_TAG)] == [(fired, 1.0)]
    assert tb_group_order(events.Tags()["scalars"])[:2] == ["alarm", "loss"]


def test_a_healthy_tiny_run_does_not_set_off_the_alarm_and_a_window_it_cannot_read_is_refused(tmp_path, caplog):
    windows = ("trainer.log_every=2", "trainer.d_won_window=10", "trainer.sample_every=1000")
    assert train(compose_config("trainer.max_steps=100", *windows), tmp_path).step == 100
    assert "D has won" not in caplog.text
    # log points sparser than the window leave the alarm nothing to read, unless it is off
    assert compose_config("trainer.on_d_won=off", "trainer.log_every=50", "trainer.d_won_window=10").trainer
    with pytest.raises(ConfigError, match=r"of the window \(or trainer.on_d_won=off\)"):
        compose_config("trainer.log_every=50", "trainer.d_won_window=10")


def test_ada_p_rises_while_d_is_sure_of_the_reals_and_falls_when_it_is_not():
    ada = AdaptiveAugment(["translation"], target=0.6, speed_kimg=0.512, batch_size=32, interval=4)
    step = 4 * 32 / 512  # the whole range in 512 images: a quarter per adjustment (every 4 steps of 32)
    for _ in range(4):
        ada.observe(torch.tensor(1.0))
    assert math.isclose(float(ada.p), step)
    for _ in range(16):
        ada.observe(torch.tensor(0.9))
    assert float(ada.p) == 1.0  # clamped
    for _ in range(8):
        ada.observe(torch.tensor(0.0))
    assert math.isclose(float(ada.p), 1.0 - 2 * step) and ada.p_now == float(ada.p)  # read once per move
    assert not torch.equal(ada(x := torch.randn(4, 1, 8, 8)), x)
    for _ in range(8):
        ada.observe(torch.tensor(0.0))
    assert float(ada.p) == 0 and ada(x) is x  # back at 0: the images themselves, whatever the device


def test_ada_at_p_0_is_the_identity_at_p_1_diffaugment_from_its_own_generator_and_passes_g_gradient_through():
    x = torch.randn(8, 1, 16, 16)
    ada = AdaptiveAugment(["color", "translation", "cutout"], target=0.6, speed_kimg=1, batch_size=8, seed=3)
    main, own = torch.get_rng_state(), ada.generator.get_state()
    assert ada(x) is x  # p = 0: the images themselves, no copy, no draw
    assert torch.equal(ada.generator.get_state(), own) and torch.equal(torch.get_rng_state(), main)
    ada.set_p(0.5)
    assert not torch.equal(ada(x), x) and not torch.equal(ada.generator.get_state(), own)  # its own stream moved ...
    assert torch.equal(torch.get_rng_state(), main)  # ... and torch's global one did not
    ada.set_p(1.0)
    # the same draws: diff_augment's, interleaved with ADA's gate draws, which at p = 1 always pass
    ada.generator.manual_seed(5)
    mine = ada(x)
    theirs, generator = x, torch.Generator().manual_seed(5)
    for policy in ("color", "translation", "cutout"):
        torch.rand(8, 1, 1, 1, generator=generator)  # the gate's draw, which at p = 1 takes every image
        theirs = diff_augment(theirs, [policy], generator)
    assert torch.allclose(mine, theirs)
    # at p = 0.25 (cutout alone): about a quarter of the images augmented, G's gradient passing through the rest
    ada = AdaptiveAugment(["cutout"], target=0.6, speed_kimg=1, batch_size=8)
    ada.set_p(0.25)
    fake, weights = torch.randn(4000, 1, 8, 8, requires_grad=True), torch.rand(4000, 1, 8, 8)
    out = ada(fake)
    (out * weights).sum().backward()
    same = (out == fake).flatten(1).all(dim=1)
    assert abs(1 - float(same.float().mean()) - 0.25) < 0.03
    assert torch.equal(fake.grad[same], weights[same])  # an image left as it was: its gradient passes unchanged
    assert (fake.grad[~same] != weights[~same]).any() and fake.grad[~same].abs().sum() > 0  # cut out: no gradient


def test_a_run_with_ada_at_p_0_keeps_the_random_stream_and_weights_of_a_run_without_augmentation(tmp_path):
    # p moves first after the 4th step (model.ada_target's interval): 4 steps all run at p = 0
    common = ("trainer.max_steps=4", "trainer.checkpoint_every=100")
    train(compose_config(*common, "model.ada_target=0.6"), tmp_path / "ada")
    train(compose_config(*common, "model.diffaugment=[]"), tmp_path / "plain")
    ada, plain = load_checkpoint(tmp_path / "ada"), load_checkpoint(tmp_path / "plain")
    assert ada["config"]["model"]["diffaugment"] and ada["augment"] is not None and plain["augment"] is None
    assert torch.equal(ada["rng"]["torch"], plain["rng"]["torch"])  # the main stream: latents, shuffling
    assert_same_state(ada, plain)


def test_ada_p_is_checkpointed_and_a_resume_is_bit_identical(tmp_path):
    common = ("trainer.max_steps=12", "model.diffaugment=[translation,cutout]", "model.ada_target=0.01",
              "model.ada_kimg=0.5", "trainer.checkpoint_every=100")  # fmt: skip
    train(compose_config(*common), tmp_path / "straight")
    train(compose_config(*common), tmp_path / "split", after_step=stop_at(5))
    assert 0 < (halfway := load_checkpoint(tmp_path / "split"))["augment"]["p"] < 1  # mid-range: resumed, not reset
    train(compose_config(*common, f"trainer.resume={tmp_path / 'split'}"), tmp_path / "split")
    straight, resumed = load_checkpoint(tmp_path / "straight"), load_checkpoint(tmp_path / "split")
    assert straight["augment"] == resumed["augment"]
    assert torch.equal(straight["rng"]["augment"], resumed["rng"]["augment"])
    assert_same_state(straight, resumed)
    # the augmentation's generator travels in the checkpoint: resumed without it, the run is another one
    run_dir = tmp_path / "without"
    (run_dir / "checkpoints").mkdir(parents=True)
    torch.save({**halfway, "rng": {**halfway["rng"], "augment": None}}, run_dir / "checkpoints" / "last.pt")
    train(compose_config(*common, f"trainer.resume={run_dir}"), run_dir)
    assert not torch.equal(load_checkpoint(run_dir)["D"]["features.0.bias"], straight["D"]["features.0.bias"])
    # without p, it would restart from 0, not the run continued: refused, naming the entry
    torch.save({**halfway, "augment": None}, run_dir / "checkpoints" / "last.pt")
    with pytest.raises(CheckpointError, match="entry 'augment' is missing or damaged"):
        train(compose_config(*common, f"trainer.resume={run_dir}"), tmp_path / "continued")


@pytest.mark.parametrize("stored", [None, 3, "2"], ids=["none", "3", "text"])  # none, another number, text
def test_a_checkpoint_of_another_format_is_refused_naming_both_versions(tiny_run, tmp_path, stored):
    # load_checkpoint is what trainer.resume, evaluate.py and generate.py read through
    state = torch.load(tiny_run / "checkpoints" / "last.pt", weights_only=True)
    assert state.pop("format") == FORMAT == 2
    torch.save(state if stored is None else {**state, "format": stored}, tmp_path / "last.pt")
    with pytest.raises(CheckpointError, match="this version reads format 2 only") as refused:
        load_checkpoint(tmp_path / "last.pt")
    assert f"has checkpoint format {'none' if stored is None else repr(stored)}" in str(refused.value)


def test_a_stored_config_without_a_setting_is_damaged(tmp_path):
    config = to_plain(compose_config())  # as a checkpoint stores it
    del config["model"]["spectral_norm"]
    with pytest.raises(CheckpointError, match="is damaged: it has no model.spectral_norm"):
        stored_config(config, tmp_path / "last.pt")
