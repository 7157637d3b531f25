"""scripts/compare.py, canonical_dcgan.py, one_minute.py and longer.py, in parts and end to end."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, run_script
from torch import nn

from gan.training import train
from scripts import canonical_dcgan as canonical
from scripts import compare, longer


def test_canonical_networks_at_64_px_are_main_py_s():
    """main.py prints its networks: G 3,576,704 and D 2,765,568 parameters for RGB at 64 px."""
    G, D = canonical.Generator(canonical.NZ, canonical.NGF, 3, 64), canonical.Discriminator(canonical.NDF, 3, 64)
    assert [sum(p.numel() for p in net.parameters()) for net in (G, D)] == [3_576_704, 2_765_568]
    kinds = [type(m).__name__ for m in G.main]
    assert kinds == ["ConvTranspose2d", "BatchNorm2d", "ReLU"] * 4 + ["ConvTranspose2d", "Tanh"]
    kinds = [type(m).__name__ for m in D.main]
    assert kinds == ["Conv2d", "LeakyReLU"] + ["Conv2d", "BatchNorm2d", "LeakyReLU"] * 3 + ["Conv2d", "Sigmoid"]


@pytest.mark.parametrize("size", [16, 32, 64])
def test_canonical_networks_build_every_power_of_two_and_refuse_other_sizes(size):
    for bad in (8, 24, size + 8):
        pytest.raises(ValueError, canonical.Generator, 8, 4, 1, bad).match("powers of two from 16")
    G, D = canonical.Generator(8, 4, 1, size), canonical.Discriminator(4, 1, size)
    images = G(torch.randn(5, 8, 1, 1))
    assert images.shape == (5, 1, size, size) and images.abs().max() <= 1
    scores = D(images)
    assert scores.shape == (5,) and ((scores > 0) & (scores < 1)).all()
    assert sum(isinstance(m, nn.ConvTranspose2d) for m in G.modules()) == size.bit_length() - 2  # log2(size) - 1


def test_weights_init_is_the_dcgan_papers():
    G = canonical.Generator(100, 64, 1, 32).apply(canonical.weights_init)
    conv = torch.cat([m.weight.flatten() for m in G.modules() if isinstance(m, nn.ConvTranspose2d)])
    norm = torch.cat([m.weight.flatten() for m in G.modules() if isinstance(m, nn.BatchNorm2d)])
    assert abs(conv.mean().item()) < 1e-3 and conv.std().item() == pytest.approx(0.02, rel=0.02)
    assert norm.mean().item() == pytest.approx(1.0, abs=0.01) and norm.std().item() == pytest.approx(0.02, rel=0.2)
    assert all((m.bias == 0).all() for m in G.modules() if isinstance(m, nn.BatchNorm2d))


def test_canonical_g_gradient_is_the_g_loss_alone():
    """G's .grad after an iteration is d BCE(D'(G(z)), 1) / dG alone, D' the updated D (fake.detach(), zero_grad())."""
    netG, netD = canonical.Generator(8, 4, 1, 16), canonical.Discriminator(4, 1, 16)
    netG.apply(canonical.weights_init)
    netD.apply(canonical.weights_init)
    G_before = copy.deepcopy(netG)
    opt_d = torch.optim.Adam(netD.parameters(), lr=canonical.LR, betas=(canonical.BETA1, 0.999))
    opt_g = torch.optim.Adam(netG.parameters(), lr=canonical.LR, betas=(canonical.BETA1, 0.999))
    real, noise = torch.rand(6, 1, 16, 16) * 2 - 1, torch.randn(6, 8, 1, 1)
    canonical.iteration(netG, netD, nn.BCELoss(), opt_d, opt_g, real, noise)
    expected = torch.autograd.grad(nn.BCELoss()(netD(G_before(noise)), torch.ones(6)), list(G_before.parameters()))
    for got, want in zip((p.grad for p in netG.parameters()), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_images_dataset_applies_main_py_s_transform():
    images = torch.tensor([0, 255, 128], dtype=torch.uint8).view(3, 1, 1, 1)
    data = canonical.Images(images, torch.zeros(3, dtype=torch.long))
    assert [data[i][0].item() for i in range(3)] == pytest.approx([-1.0, 1.0, 128 / 255 * 2 - 1], abs=1e-6)  # float32


def test_sampler_uses_batch_statistics_or_running_ones():  # torch seeded by conftest's autouse fixture
    netG, z = canonical.Generator(8, 4, 1, 16).eval(), torch.randn(8, 8)
    with torch.no_grad():
        eval_mode = canonical.Sampler(copy.deepcopy(netG), 8, batch_statistics=False).eval()(z)
        train_mode = canonical.Sampler(copy.deepcopy(netG), 8, batch_statistics=True, batch=4).eval()(z)
        halves = torch.cat([copy.deepcopy(netG).train()(half.view(-1, 8, 1, 1)) for half in z.split(4)])
    torch.testing.assert_close(eval_mode, netG(z.view(-1, 8, 1, 1)))
    torch.testing.assert_close(train_mode, halves)  # each batch of 4 normalised by its own statistics
    assert not torch.allclose(train_mode, eval_mode)


def test_snapshot_times_are_geometric_and_end_at_the_budget():
    times = compare.snapshot_times(900.0)
    assert times[-1] == pytest.approx(900.0) and 60.0 in times
    geometric = [t for t in times if t != 60.0]
    ratios = [b / a for a, b in zip(geometric, geometric[1:])]
    assert ratios == pytest.approx([2**0.5] * len(ratios))
    assert 7 < geometric[0] <= 15
    assert len(compare.snapshot_times(2.0)) >= 3 and compare.snapshot_times(2.0)[-1] == pytest.approx(2.0)


@pytest.mark.parametrize(
    "times, seconds, last, saved, stops",
    [  # 0.5, 1.2, 2.3, 3.1 s in all; then a run that ends at 2.5 s, between 2 and 4: snapshotted at its end
        ([1.0, 2.0, 3.0], [0.0, 0.5, 0.7, 1.1, 0.8], 0, [(3, 1.2), (4, 2.3), (5, 3.1)], [False] * 4 + [True]),
        ([1.0, 2.0, 4.0, 8.0], [0.0, 1.5, 1.0], 3, [(2, 1.5), (3, 2.5)], [False, False, True]),
    ],
)
def test_budget_clock_starts_after_the_first_step_pauses_for_snapshots_and_snapshots_an_early_end(
    tmp_path, monkeypatch, times, seconds, last, saved, stops
):
    now = {"t": 100.0}
    monkeypatch.setattr(compare.time, "perf_counter", lambda: now["t"])

    def snapshot():
        now["t"] += 50.0  # a slow snapshot: the clock must not count it
        return {"weights": torch.zeros(1)}

    budget, ticked = compare.Budget(times, tmp_path), []
    for step, training_seconds in enumerate(seconds, start=1):
        now["t"] += training_seconds
        ticked.append(budget.tick(step, snapshot, last=step == last))
    found = [torch.load(p, weights_only=True) for p in sorted(tmp_path.glob("*.pt"))]
    assert [(s["step"], round(s["seconds"], 2)) for s in found] == saved and ticked == stops


def rows(side, points):
    return [{"side": side, "seconds": s, "step": i, "fid": f, "recall": 0.5} for i, (s, f) in enumerate(points)]


def test_summary_numbers():
    canon = rows("canonical", [(10, 80.0), (100, 12.0), (400, 10.0), (800, 11.0)])
    project = rows("project", [(10, 40.0), (50, 9.0), (400, 3.0), (800, 2.0)])
    summary = compare.summarise(canon, project)
    assert summary["time_to_quality"] == pytest.approx(400 / 50)  # canonical's best (10.0 at 400 s), reached at 50 s
    assert summary["fid_at_budget_ratio"] == pytest.approx(11.0 / 2.0)
    assert compare.summarise(canon, rows("project", [(10, 40.0), (800, 20.0)]))["time_to_quality"] == 0.0  # never
    assert re.fullmatch(r"time_to_quality=8 fid_at_budget_ratio=5.5 fid_project=2 fid_canonical=11 "
                        r"recall_project=0.5 recall_canonical=0.5", compare.summary_line(summary))  # fmt: skip


TINY_RACE = ["debug=tiny", "data.num_samples=2000", "trainer.log_every=1000", "metrics.classifier.min_accuracy=0"]


@pytest.fixture(scope="module")
def race(tmp_path_factory, classifier_cache) -> list[str]:
    """TINY_RACE with a data.root that holds the session's metrics classifier: none trained again."""
    root = tmp_path_factory.mktemp("data")
    shutil.copytree(classifier_cache, root / "classifiers")
    return [*TINY_RACE, f"data.root={root}"]


@pytest.mark.slow
def test_compare_runs_end_to_end(tmp_path):
    # trainer.max_steps past the budget: debug=tiny's 6 steps would end the project's run first
    overrides = [*TINY_RACE, "trainer.max_steps=1000000"]
    done = run_script("compare.py", *overrides, "--budget-s", "3", "--samples", "200", "--out", "race", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    last, number = done.stdout.strip().splitlines()[-1], r"[0-9.e+-]+|inf|nan"
    keys = "time_to_quality fid_at_budget_ratio fid_project fid_canonical recall_project recall_canonical".split()
    assert re.fullmatch(" ".join(f"{key}=(?:{number})" for key in keys), last), last
    result = json.loads((tmp_path / "race" / "compare.json").read_text())
    sides = {side: [row for row in result["rows"] if row["side"] == side] for side in ("canonical", "project")}
    for side, mine in sides.items():
        assert len(mine) == len(compare.snapshot_times(3.0))
        assert [row["seconds"] for row in mine] == sorted(row["seconds"] for row in mine)
        assert mine[-1]["seconds"] >= 3.0 and all(row["fid"] > 0 for row in mine)
        assert result["runs"][side]["iterations"] >= mine[-1]["step"]
    assert result["summary"] == compare.summarise(sides["canonical"], sides["project"])
    assert (tmp_path / "race" / "fid_vs_time.png").stat().st_size > 10_000
    assert list((tmp_path / "race" / "canonical" / "run").glob("fake_samples_epoch_000.png"))  # main.py's own files
    again = run_script("compare.py", *overrides, "--budget-s", "3", "--out", "race", cwd=tmp_path)
    assert again.returncode == 2 and "already holds a comparison" in again.stderr


@pytest.mark.slow
def test_one_minute_sends_a_real_ctrl_c_and_measures_what_it_left(tmp_path):
    args = ("debug=tiny", "data.num_samples=2000", "trainer.max_steps=100000", "trainer.log_every=1000")
    command = [sys.executable, ROOT / "scripts" / "one_minute.py", *args, "metrics.classifier.min_accuracy=0"]
    # a process of its own: the Ctrl-C it sends itself must not reach pytest
    done = subprocess.run([*command, "--seconds", "2", "--samples", "200", "--out", "run"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stopped by SIGINT" in done.stdout
    match = re.search(r"one_minute steps=(\d+) seconds=([0-9.]+) fid=([0-9.]+) classes=(\d+)", done.stdout)
    assert match and float(match[2]) >= 2.0
    metrics = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())
    assert metrics["step"] == int(match[1]) and f"{metrics['fid']:.2f}" == match[3]


def test_longer_compares_each_snapshot_with_the_best_before_it():
    points = [(5, 10.0, 0.5), (10, 8.0, 0.8), (20, 8.5, 0.75), (40, 9.0, 0.7)]
    rows, summary = longer.against_best([{"step": s, "fid": f, "recall": r} for s, f, r in points], base=10)
    assert [row["times"] for row in rows] == [0.5, 1.0, 2.0, 4.0]
    assert rows[2]["fid_vs_best"] == pytest.approx(8.5 / 8.0) and rows[3]["recall_vs_best"] == pytest.approx(0.7 / 0.8)
    # from 2x on: the worst FID ratio is step 40's 9/8 = 1.125 > 1.1, so the recipe does not hold
    assert summary["worst_fid_ratio"] == pytest.approx(1.125) and summary["holds"] == 0.0
    assert summary["best_step"] == 10
    # read at 2x and 4x only (no snapshot at 10x here): step 20's 8.5/8 = 1.06 holds, step 40's 1.125 does not
    assert summary["fid_ratio_at_2x"] == pytest.approx(8.5 / 8.0) and summary["fid_ratio_at_4x"] == pytest.approx(1.125)
    assert "fid_ratio_at_10x" not in summary and summary["holds_at_multiples"] == 0.0
    assert "at_2x=1.06/0.938 at_4x=1.12/0.875" in longer.summary_line(summary)
    wobble = [{"step": s, "fid": f, "recall": 0.8} for s, f in {5: 10.0, 10: 8.0, 20: 8.0, 30: 9.0, 40: 8.5}.items()]
    _, summary = longer.against_best(wobble, base=10)
    # step 30 (3x) is 1.125x the best and fails the every-snapshot bar; the snapshots at 2x and 4x hold
    assert summary["holds"] == 0.0 and summary["worst_fid_ratio"] == pytest.approx(1.125)
    assert summary["fid_ratio_at_4x"] == pytest.approx(8.5 / 8.0) and summary["holds_at_multiples"] == 1.0
    better = [dict(r, fid=8.0 - r["step"] / 100, recall=0.5 + r["step"] / 100) for r in rows]
    assert longer.against_best(better, base=10)[1]["holds"] == 1.0
    _, early = longer.against_best(rows[:2], base=10)  # no snapshot from 2x on: no verdict either way
    assert longer.summary_line(early).startswith("holds=n/a worst_fid_ratio=nan")


def test_longer_runs_end_to_end_averaging_draws_of_latents_and_measures_only_the_missing_ones(tmp_path, race):
    # a row is the mean of --draws draws of latents; a larger --draws later adds draws, keeping the measured ones
    overrides = [*race, "trainer.max_steps=4"]
    done = run_script("longer.py", *overrides, "--factor", "2", "--every", "4", "--samples", "100", "--draws", "2",
                      "--out", "run", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("holds=") and " draws=2 at_2x=" in last
    assert (tmp_path / "run" / "fid_vs_steps.png").stat().st_size > 0
    result = json.loads((tmp_path / "run" / "longer.json").read_text())
    rows, reals = result["rows"], result["reals"]
    assert [row["step"] for row in rows] == [4, 8] and result["base_steps"] == 4
    # the data's own score: real training images are far closer to the held-out ones than an 8-step G
    assert len(reals["draws"]) == 2 and 0 <= reals["fid"] < min(row["fid"] for row in rows) / 5
    assert reals["recall"] > max(row["recall"] for row in rows)
    assert f"real training images against the same held-out images: FID {reals['fid']:.2f}" in done.stdout
    for row in rows:
        fids = [d["fid"] for d in row["draws"]]
        assert len(fids) == 2 and fids[0] != fids[1]  # other latents, other samples
        assert row["fid"] == pytest.approx(sum(fids) / 2) and row["fid_sd"] > 0
        assert row["recall"] == pytest.approx(sum(d["recall"] for d in row["draws"]) / 2)
    # a row stored before --draws (its values at the top level) is that snapshot's draw 0
    cache = tmp_path / "run" / "rows.json"
    stored = json.loads(cache.read_text())
    old = [{"step": r["step"], **r["draws"][0]} for r in stored]
    old[0]["fid"] = 123.0  # a value no draw of this run gives: it must be read back, not re-measured
    cache.write_text(json.dumps(old))
    measurer = longer.measurer_for(overrides, samples=100)
    more = longer.measure_all(tmp_path / "run", measurer, draws=3)
    assert [len(row["draws"]) for row in more] == [3, 3]
    assert more[0]["draws"][0]["fid"] == 123.0
    assert more[1]["draws"][0] == stored[1]["draws"][0]  # draw 0 kept, draws 1 and 2 measured
    # the same latents again, measured in this process: equal up to float32 reduction order (other threads)
    assert more[1]["draws"][1]["fid"] == pytest.approx(stored[1]["draws"][1]["fid"], rel=1e-4)
    assert more[0]["fid"] == pytest.approx(sum(d["fid"] for d in more[0]["draws"]) / 3)
    assert [len(row["draws"]) for row in longer.measure_all(tmp_path / "run", measurer, draws=1)] == [1, 1]
    bad = run_script("longer.py", "--out", "run", "--measure-only", "--draws", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "--draws" in bad.stderr
    both = run_script("longer.py", "--plot", "a=run", "b=run", "--out", "both.png", cwd=tmp_path)
    assert both.returncode == 0 and (tmp_path / "both.png").stat().st_size > 0, both.stderr[-2000:]
    missing = run_script("longer.py", "--plot", "a=nowhere", "--out", "x.png", cwd=tmp_path)
    assert missing.returncode == 2 and "longer.json" in missing.stderr
    again = run_script("longer.py", *overrides, "--out", "run", cwd=tmp_path)  # a second run over the first: refused
    assert again.returncode == 2 and "already holds a run" in again.stderr


def test_longer_extends_an_earlier_run_to_the_same_generators_as_a_longer_one(tmp_path, monkeypatch, race):
    # --extend resumes OUT/run, also a run cut off part-way (about.json comes first): the snapshots past its
    # checkpoint are those a run with the larger factor holds
    def cut_at_step_3(cfg, run_dir, after_step):
        def step_then_fail(state):
            after_step(state)
            if state.step == 3:
                raise RuntimeError("the machine went away")
            return False

        return train(cfg, run_dir, after_step=step_then_fail)

    overrides = [*race, "trainer.max_steps=4", "trainer.checkpoint_every=2"]
    longer.train_longer(compare.train_config(overrides), 2, 2, tmp_path / "a", 0)  # what longer.py trains, unmeasured
    with monkeypatch.context() as patched:
        patched.setattr(longer, "train", cut_at_step_3)
        with pytest.raises(RuntimeError, match="went away"):
            longer.main(longer.parse([*overrides, "--factor", "1", "--every", "2", "--out", str(tmp_path / "b")]))
    assert json.loads((tmp_path / "b" / "about.json").read_text())["base_steps"] == 4
    assert not (tmp_path / "b" / "longer.json").exists()
    extended = run_script("longer.py", "--out", "b", "--extend", "--factor", "2", "--every", "2", "--samples", "100",
                          "--draws", "1", cwd=tmp_path)  # fmt: skip
    assert extended.returncode == 0, extended.stderr[-3000:]
    result = json.loads((tmp_path / "b" / "longer.json").read_text())
    assert [row["step"] for row in result["rows"]] == [2, 4, 6, 8] and result["factor"] == 2
    for step in (4, 6, 8):
        a, b = (torch.load(tmp_path / run / "snapshots" / f"step_{step:07d}.pt", weights_only=True) for run in "ab")
        assert a["step"] == b["step"] == step
        for name in ("G", "G_ema"):
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)  # the same keys, bit for bit
    # at or below the run's step there is nothing to train; overrides would change the run: both refused
    again = run_script("longer.py", "--out", "b", "--extend", "--factor", "2", cwd=tmp_path)
    assert again.returncode == 2 and "not beyond" in again.stderr, again.stderr[-2000:]
    changed = run_script("longer.py", "--out", "b", "--extend", "--factor", "3", "optim.lr=1e-4", cwd=tmp_path)
    assert changed.returncode == 2 and "--extend" in changed.stderr
    nothing = run_script("longer.py", "--out", "c", "--extend", "--factor", "3", cwd=tmp_path)
    assert nothing.returncode == 2 and "no run" in nothing.stderr
