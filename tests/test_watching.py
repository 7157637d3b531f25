"""What TensorBoard shows of a run and of a sweep, read with TensorBoard's own code, and the samples' animation."""

from __future__ import annotations

import json
import platform
import re
import shutil
from pathlib import Path

import pytest
import torch
import torchvision
from conftest import DEVICE, ROOT, compose_config, output_of, run_script, run_train
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from tensorboard import default, program
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from werkzeug.test import Client

from gan.checkpoint import load_checkpoint
from gan.config import run_suffix
from gan.evaluation.pipeline import IMAGES_GROUP, METRICS_TEXT_TAG
from gan.launch import SweepNames
from gan.training import train
from gan.training.loop import ALARM_TAG, BEST_FID_TAG, COMPARED, FID_TAG, FINAL_FID_TAG, hparams_of
from gan.training.monitor import FAKE_TAG, REAL_TAG, write_progress_gif
from scripts import tensorboard_screenshots as shots

LOSS_CHARTS = ["loss/D(G(z))", "loss/D(x)", "loss/d", "loss/g"]  # TensorBoard's order


def tb_group_order(tags: list[str]) -> list[str]:
    """The tag groups in the order TensorBoard's Time Series and Scalars pages list them."""

    def natural_key(tag: str) -> list:  # TensorBoard 2.21's: runs of digits as numbers, '/' and digits first
        parts = re.findall(r"\d+|.", tag, flags=re.DOTALL)
        return [(0, int(p), "") if p.isdigit() else (0, -1, "") if p == "/" else (1, 0, p) for p in parts]

    return list(dict.fromkeys(tag.split("/", 1)[0] for tag in sorted(tags, key=natural_key)))


def events_of(run_tb: Path) -> EventAccumulator:
    return EventAccumulator(str(run_tb), size_guidance={"images": 0, "scalars": 0, "tensors": 0}).Reload()


class TensorBoardClient:
    """TensorBoard's WSGI app over `logdir` (every default plugin), asked as its web page asks."""

    def __init__(self, logdir: Path):
        multiplexer = plugin_event_multiplexer.EventMultiplexer().AddRunsFromDirectory(str(logdir)).Reload()
        provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
        tb = program.TensorBoard(default.get_plugins())
        tb.configure(logdir=str(logdir))
        app = application.TensorBoardWSGIApp(tb.flags, tb.plugin_loaders, provider, tb.assets_zip_provider, multiplexer)
        self.client = Client(app)

    def get(self, path: str) -> object:
        return self.client.get(path).get_json()

    def post(self, path: str, body: dict) -> object:
        response = self.client.post(path, json=body, headers={"X-XSRF-Protected": "1"})
        assert response.status_code == 200, response.get_data(as_text=True)
        return response.get_json()

    def experiment(self) -> dict:
        return self.post("/data/plugin/hparams/experiment", {"experimentName": ""})

    def session_groups(self) -> list[dict]:
        statuses = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]
        body = {"experimentName": "", "allowedStatuses": statuses, "colParams": [], "startIndex": 0, "sliceSize": 100}
        return self.post("/data/plugin/hparams/session_groups", body)["sessionGroups"]


def test_the_first_screen_opens_on_the_losses_and_the_grids_and_the_run_is_one_hparams_session(tiny_run):
    """The tiny run (scalars at 2, 4, 6, grids at 3, 6): its first screen, its HParams session, its Text tab."""
    tags = (events := events_of(tiny_run / "tb")).Tags()
    # Time Series shows scalars and images together; Scalars shows scalars only
    assert tb_group_order(tags["scalars"] + tags["images"])[:2] == ["loss", "samples"]
    assert tb_group_order(tags["scalars"])[0] == "loss"
    # the loss group is the four charts a 1400 x 1000 window shows first (two columns of cards)
    assert sorted(tag for tag in tags["scalars"] if tag.startswith("loss/")) == sorted(LOSS_CHARTS)
    assert {"train/lr_g", "train/lr_d", "time/img_per_s", "time/sec_per_kimg"} <= set(tags["scalars"])
    assert set(tags["images"]) == {REAL_TAG, FAKE_TAG}
    # a healthy run writes no alarm (the group that would open first), no FID/, nothing duplicated as final/
    assert ALARM_TAG not in tags["scalars"] and not [t for t in tags["scalars"] if t.startswith(("FID/", "final/"))]
    points = {tag: [e.step for e in events.Scalars(tag)] for tag in tags["scalars"]}
    assert all(len(steps) >= 2 for steps in points.values()), points  # no chart is a single point
    assert points["loss/d"] == [2, 4, 6]
    assert points["time/phase_sample_s"] == [3, 6] and points["time/phase_checkpoint_s"] == [3, 6]
    # the real images once, the EMA grid at every sample step
    real, fake = events.Images(REAL_TAG), events.Images(FAKE_TAG)
    assert [i.step for i in real] == [0] and [i.step for i in fake] == [3, 6]
    assert (real[0].width, real[0].height) == (fake[0].width, fake[0].height)  # the same 4 x 4 layout
    # a session start and end, no experiment summary (it would be read as every run's experiment)
    assert set(events.PluginTagToContent("hparams")) == {"_hparams_/session_start_info", "_hparams_/session_end_info"}
    tb = TensorBoardClient(tiny_run)
    infos = {info["name"]: info for info in tb.experiment()["hparamInfos"]}
    assert list(COMPARED) == ["data", "loss", "optim.lr", "trainer.max_steps"] and set(infos) == set(COMPARED)
    assert infos["data"]["domainDiscrete"] == ["digits"] and infos["loss"]["domainDiscrete"] == ["bce"]
    assert infos["trainer.max_steps"]["domainDiscrete"] == ["6"]  # a whole number as text: 6, not 6.0000
    assert infos["optim.lr"]["domainInterval"] == {"minValue": 0.001, "maxValue": 0.001}
    (group,) = tb.session_groups()
    (session,) = group["sessions"]
    assert session["name"] == "tb" and session["status"] == "STATUS_SUCCESS"
    assert group["name"] == "run"  # the trial id: the run folder's name
    assert set(tb.get("/data/plugin/text/tags")["tb"]) == {"run/config", "run/command", "run/environment"}
    environment = tb.get("/data/plugin/text/text?run=tb&tag=run/environment")[0]["text"]
    device = "device: cpu (" if DEVICE in (None, "cpu") else f"device: {torch.cuda.get_device_name()}"
    for line in (f"torch: {torch.__version__}", f"torchvision: {torchvision.__version__}", device):
        assert line in environment, environment
    assert f"python: {platform.python_version()}" in environment
    assert ("git_commit: " in environment) == (shutil.which("git") is not None)  # the tests run from a clone
    config, command = (tb.get(f"/data/plugin/text/text?run=tb&tag=run/{tag}") for tag in ("config", "command"))
    assert [entry["step"] for entry in config] == [0] and [entry["step"] for entry in command] == [0]
    # every key, defaults included; the command with its overrides, not Hydra's own (hydra.run.dir)
    assert "lr: 0.001" in config[0]["text"] and "max_steps: 6" in config[0]["text"]
    # inline code, which wraps at the page's edge: a code block (<pre>) would scroll sideways
    assert "<code>python train.py debug=tiny</code>" in command[0]["text"] and "<pre>" not in command[0]["text"]


def test_every_run_reports_the_four_settings_and_a_sweep_adds_its_keys_outside_them():  # model.conditional in `data`
    conditional = compose_config("model.conditional=true", "loss=hinge", "model.g_width=12")
    swept = ["model.g_width=12", "loss=hinge", "model.conditional=true", "experiment=wgan_gp", "~model.pack"]
    four = {"data": "digits, conditional", "loss": "hinge", "optim.lr": 0.001, "trainer.max_steps": "6"}
    assert hparams_of(conditional) == four
    assert hparams_of(conditional, swept) == {**four, "model.g_width": "12", "experiment": "wgan_gp"}


def test_progress_gif_keeps_at_most_50_frames_first_and_last_included(tmp_path):
    for step in range(120):
        Image.new("L", (8, 8), color=2 * step).save(tmp_path / f"step_{step:06d}.png")
    with Image.open(write_progress_gif(tmp_path)) as gif:
        first = gif.convert("L").getpixel((0, 0))
        gif.seek(49)
        assert (gif.n_frames, first, gif.convert("L").getpixel((0, 0))) == (50, 0, 2 * 119)


def test_a_single_run_is_named_by_its_time_and_the_overrides_that_set_what_it_computes(tmp_path):
    """`tensorboard --logdir outputs` names a run by its folder: a single run's says what it is."""
    shown = ("trainer.log_every=2", "trainer.sample_every=3", "trainer.checkpoint_every=3")
    result = run_train("loss=hinge", "trainer.threads=1", *shown, f"data.root={tmp_path / 'data'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    # the time, then the overrides; threads, log/sample/checkpoint cadences and data paths left out
    assert re.fullmatch(r"\d\d-\d\d-\d\d_debug-tiny\+loss-hinge", run_dir.name), run_dir.name
    assert (run_dir / "tb").is_dir() and (run_dir / "checkpoints" / "last.pt").is_file()
    assert not (ROOT / "runs").exists()  # SummaryWriter got an explicit log_dir


def test_run_suffix_keeps_folders_flat_and_names_short():
    assert run_suffix([]) == "" and run_suffix(["trainer.threads=1"], ["trainer.threads"]) == ""
    assert run_suffix(["optim.lr=2e-4", "loss=hinge"]) == "_loss-hinge+optim.lr-2e-4"  # sorted, as Hydra sorts
    named = run_suffix(["data=folder", "model.diffaugment=[color,cutout]", "+x.y='a b/c'", "hydra.run.dir=/x"])
    assert named == "_data-folder+model.diffaugment-color-cutout+x.y-a_b-c"
    assert len(run_suffix(["k=" + "x" * 500])) == 121  # one override longer than the limit: cut in its value
    # never cut mid-override: the name ends at the last whole one that fits in 120 characters
    long = ["a=" + "x" * 80, "b=" + "y" * 30, "c=" + "z" * 30]
    assert run_suffix(long) == "_a-" + "x" * 80 + "+b-" + "y" * 30
    # the folder is what trainer.resume= is given: the path must read unquoted in Hydra's grammar
    parsed = OverridesParser.create().parse_override(f"trainer.resume=outputs/2026-11-24/14-13-01{named}")
    assert parsed.value() == f"outputs/2026-11-24/14-13-01{named}"


@pytest.fixture(scope="module")
def watched_sweep(tmp_path_factory) -> Path:
    """`-m optim.lr=1e-4,4e-4 loss=bce,hinge` with the FID measured and constant overrides beside it."""
    sweep_dir = tmp_path_factory.mktemp("watch") / "sweep"
    overrides = ["optim.lr=1e-4,4e-4", "loss=bce,hinge", "trainer.log_every=2",
                 "trainer.eval_every=3", "trainer.eval_samples=64", f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    result = run_train("-m", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return sweep_dir


SWEEP_JOBS = ["0_loss=bce,optim.lr=0.0001", "1_loss=hinge,optim.lr=0.0001", "2_loss=bce,optim.lr=0.0004",
              "3_loss=hinge,optim.lr=0.0004"]  # fmt: skip


def test_sweep_jobs_are_named_by_what_varies_only_and_their_results_open_the_page(watched_sweep):
    """FID/best once, at each run's end (one dot); HParams: settings that differ first, then FID/best and the losses."""
    assert sorted(p.name for p in watched_sweep.iterdir() if p.is_dir()) == SWEEP_JOBS
    tb = TensorBoardClient(watched_sweep)
    assert tb.get("/data/runs") == [f"{name}/tb" for name in SWEEP_JOBS]
    lrs = [load_checkpoint(watched_sweep / job)["config"]["optim"]["lr"] for job in SWEEP_JOBS]
    assert lrs == [1e-4, 1e-4, 4e-4, 4e-4]  # each job its own run, with its own settings
    for job in SWEEP_JOBS:
        events = events_of(watched_sweep / job / "tb")
        assert [e.step for e in events.Scalars(BEST_FID_TAG)] == [6]
        assert not [t for t in events.Tags()["scalars"] if "step_of" in t]
        assert len(events.Scalars(FID_TAG)) == 2  # the curve, at 3 and 6
        assert tb_group_order(events.Tags()["scalars"] + events.Tags()["images"])[:2] == ["FID", "loss"]
    infos = (experiment := tb.experiment())["hparamInfos"]
    shown = sorted(infos, key=lambda info: (not info["differs"], info["name"]))[:5]  # the page's (up to five)
    # the two that differ first, then the constants of the four (not debug, log_every, ...)
    assert [info["name"] for info in shown] == ["loss", "optim.lr", "data", "trainer.max_steps"]
    types = {info["name"]: info["type"] for info in infos}
    assert types["loss"] == "DATA_TYPE_STRING" and types["optim.lr"] == "DATA_TYPE_FLOAT64"
    metrics = [m["name"]["tag"] for m in experiment["metricInfos"]]
    assert metrics[:5] == [BEST_FID_TAG, *LOSS_CHARTS]
    assert all(m["name"].get("group", "") == "" for m in experiment["metricInfos"])  # no sub-runs
    groups = tb.session_groups()
    # trial ids: the sweep's folder and the job number, short enough for the 10em trial column
    assert sorted(group["name"] for group in groups) == [f"sweep #{i}" for i in range(4)]
    # every run has the five metrics, whatever its loss; FID/best is the lowest point of its FID curve
    for group in groups:
        values = {v["name"]["tag"]: v["value"] for v in group["metricValues"]}
        assert set(metrics[:5]) <= set(values)
        (session,) = group["sessions"]
        best = min(events_of(watched_sweep / session["name"]).Scalars(FID_TAG), key=lambda event: event.value)
        assert values[BEST_FID_TAG] == pytest.approx(best.value)


def test_every_run_under_outputs_fills_the_same_four_columns(tiny_run, watched_sweep, tmp_path):
    """`tensorboard --logdir outputs` over a run, a sweep and a conditional run: four settings, FID/best first."""
    outputs = tmp_path / "outputs"
    shutil.copytree(tiny_run / "tb", outputs / "run" / "tb")
    for job in SWEEP_JOBS:
        shutil.copytree(watched_sweep / job / "tb", outputs / "multirun" / "sweep" / job / "tb")
    train(compose_config("model.conditional=true"), outputs / "conditional")
    experiment = (tb := TensorBoardClient(outputs)).experiment()
    differing = {info["name"] for info in experiment["hparamInfos"] if info["differs"]}
    assert {info["name"] for info in experiment["hparamInfos"]} == set(COMPARED)
    assert differing == {"data", "loss", "optim.lr"}  # all six ran 6 steps
    assert experiment["metricInfos"][0]["name"]["tag"] == BEST_FID_TAG
    groups = tb.session_groups()
    assert len(groups) == 6 and all(set(group["hparams"]) == set(COMPARED) for group in groups)
    assert sorted(group["hparams"]["data"] for group in groups) == ["digits"] * 5 + ["digits, conditional"]


def test_sweep_table_prints_a_row_per_run_best_first(watched_sweep, tmp_path):
    plot = tmp_path / "sweep.png"
    result = run_script("sweep_table.py", str(watched_sweep), "--plot", str(plot))
    assert result.returncode == 0, result.stderr[-3000:]
    constant, *lines = result.stdout.splitlines()
    assert constant == "the same in every run: data=digits  trainer.max_steps=6"  # the four's constants, once
    header = "run  loss  optim.lr  FID best  at step  FID final  recall  steps"
    assert re.sub(" +", " ", lines[0]) == header.replace("  ", " ")  # a sweep job's settings: its swept keys
    rows = [line.split() for line in lines[1:5]]
    assert sorted(row[0] for row in rows) == SWEEP_JOBS
    for row in rows:
        events = events_of(watched_sweep / row[0] / "tb")
        best = min(events.Scalars(FID_TAG), key=lambda event: event.value)
        settings = dict(part.split("=") for part in row[0].split("_", 1)[1].split(","))
        assert row[1:3] == [settings["loss"], str(float(settings["optim.lr"]))]
        assert float(row[3]) == pytest.approx(best.value, rel=1e-3) and int(row[4]) == best.step
        assert row[5] == "-" and row[7] == "6"  # no trainer.final_eval_samples; the steps
        assert float(row[6]) == pytest.approx(events.Scalars("quality/recall")[-1].value, abs=1e-3)
    assert [float(row[3]) for row in rows] == sorted(float(row[3]) for row in rows)
    assert lines[5] == f"wrote {plot}" and Image.open(plot).size[0] > 0


def sweep_start(task: list[str], hydra: list[str] = ()) -> DictConfig:
    """What SweepNames sees as a sweep starts: the command's overrides, Hydra's, and configs/train.yaml's list."""
    excluded = ["trainer.resume", "trainer.threads"]
    job = {"config": {"override_dirname": {"exclude_keys": excluded}}}
    config = OmegaConf.create({"hydra": {"overrides": {"task": task, "hydra": list(hydra)}, "job": job}})
    SweepNames().on_multirun_start(config)
    return config


def test_a_sweep_excludes_from_its_job_names_the_overrides_that_do_not_vary():
    config = sweep_start(["optim.lr=1e-4,4e-4", "loss=bce,hinge", "trainer.threads=1", "+data.seed=3"])
    added = list(config.hydra.overrides.hydra)
    assert len(added) == 1 and added[0].startswith(f"{SweepNames.EXCLUDE_KEYS}=[")
    excluded = added[0].split("=", 1)[1]
    assert "'trainer.threads'" in excluded and "'data.seed'" in excluded and "'trainer.resume'" in excluded
    assert "optim.lr" not in excluded and "'loss'" not in excluded
    assert list(sweep_start(["optim.lr=1e-4,4e-4"]).hydra.overrides.hydra) == []  # nothing constant
    chosen = [f"{SweepNames.EXCLUDE_KEYS}=[debug]"]
    assert list(sweep_start(["optim.lr=1e-4,4e-4", "debug=tiny"], chosen).hydra.overrides.hydra) == chosen


@pytest.mark.slow
def test_eval_every_puts_the_fid_curve_beside_the_losses_and_the_final_fid_among_the_metrics(tmp_path):
    """quality/* curves, and evaluate.py's FID/final, pictures and table, all in the run's own events."""
    run_dir = tmp_path / "run"
    digits = "data.num_samples=20000"  # enough digits for the metrics classifier to pass its 97% bar
    measured = ("trainer.eval_every=3", "trainer.eval_samples=200", "trainer.final_eval_samples=300")
    result = run_train(digits, *measured, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, output_of(result)[-3000:]
    # two points: the log says TensorBoard's default smoothing will bend the curve, and what to do
    assert "trainer.eval_every=3 draws 2 point(s) of quality/FID" in output_of(result)
    tb = TensorBoardClient(run_dir)
    assert tb.get("/data/runs") == ["tb"]  # not a run of its own for the final evaluation
    tags = (events := events_of(run_dir / "tb")).Tags()
    # the result group first, then the losses; the curve's group (quality) is the third
    assert tb_group_order(tags["scalars"] + tags["images"])[:3] == ["FID", "loss", "quality"]
    assert [e.step for e in events.Scalars(FID_TAG)] == [3, 6]
    assert {"quality/precision", "quality/recall", "quality/classes_covered"} <= set(tags["scalars"])
    final = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert final["num_samples"] == 300 and (tmp_path / "data" / "classifiers").is_dir()  # cached under data.root
    assert [(e.step, e.value) for e in events.Scalars(FINAL_FID_TAG)] == [(6, pytest.approx(final["fid"]))]
    assert {"summary/samples", "summary/interpolation"} <= set(tags["images"])
    assert "run/eval_metrics" in tb.get("/data/plugin/text/tags")["tb"]
    metrics = [(m["name"]["tag"], m["name"].get("group", "")) for m in tb.experiment()["metricInfos"]]
    # the page shows the first five: the run's three results, best and final FID first, then D's outputs
    assert metrics[:5] == [(tag, "") for tag in (BEST_FID_TAG, FINAL_FID_TAG, *LOSS_CHARTS[:3])]
    (group,) = tb.session_groups()
    values = {v["name"]["tag"]: v["value"] for v in group["metricValues"]}
    assert values[FINAL_FID_TAG] == pytest.approx(final["fid"])
    # measuring leaves training alone: the same run without it logs the same losses
    plain_dir = tmp_path / "plain"
    plain = run_train(digits, f"hydra.run.dir={plain_dir}", cwd=tmp_path)
    assert plain.returncode == 0, output_of(plain)[-3000:]
    for tag in ("loss/d", "loss/g", "loss/D(x)"):
        assert [e.value for e in events_of(plain_dir / "tb").Scalars(tag)] == [e.value for e in events.Scalars(tag)]


SHOT_TAGS = ROOT / "docs" / "images" / "tensorboard_tags.json"
SHRUNK = {"trainer.max_steps": 6, "trainer.eval_every": 3, "trainer.eval_samples": 64, "trainer.log_every": 2,
          "trainer.sample_every": 3}  # fmt: skip
# d_won's alarm within 50 steps (at 32): a 10-step window and a faster D, as test_longer's FORCED
D_WON = {**SHRUNK, "trainer.max_steps": 50, "trainer.sample_every": 25, "trainer.d_won_window": 10, "optim.lr_d": 1e-2}


@pytest.mark.parametrize("case", ["run", "conditional", "d_won"])
def test_the_screenshots_show_the_tags_and_text_items_the_code_writes(case, tmp_path):
    """Each case of docs/images/tensorboard_tags.json writes its tags; when it fails, shoot the screenshots again."""
    shown = json.loads(SHOT_TAGS.read_text())
    shrunk = D_WON if case == "d_won" else SHRUNK
    overrides = [f"{key}={shrunk[key]}" if (key := o.split("=")[0]) in shrunk else o for o in shown["runs"][case]]
    result = run_train(*overrides, f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert shots.tags_of(tmp_path) == shown["tags"][case]


def test_every_tag_a_run_and_a_sweep_write_is_named_in_the_docs_and_shown_on_the_sweep_screenshots(
    tiny_run, watched_sweep
):
    """Each tag has its row in docs/watching.md; the sweep's screenshots show all but the final evaluation's."""
    written = set()
    for tb in [tiny_run / "tb", *(watched_sweep / job / "tb" for job in SWEEP_JOBS)]:
        tags = events_of(tb).Tags()
        written |= {tag for kind in ("scalars", "images", "tensors") for tag in tags[kind]}
    written = {tag for tag in written if not tag.startswith("_hparams_")}  # the HParams plugin's own records
    assert {"FID/best", "train/D(x)_score", "quality/FID", "run/command"} <= written
    page = (ROOT / "docs" / "watching.md").read_text(encoding="utf-8")  # the first column of its table of tags
    rows = [line.split(" | ")[0] for line in page.splitlines() if line.startswith("| `") or line.startswith("| Text")]
    assert written - {tag for row in rows for tag in re.findall(r"`([^`]+)`", row)} == set()
    # a fast sweep's classifier cannot pass evaluate.py's bar: the final evaluation's tags are the pictures' alone
    shown = json.loads(SHOT_TAGS.read_text())["tags"]["sweep"]
    final = {"scalars": {FINAL_FID_TAG}, "text": {METRICS_TEXT_TAG}, "images": set()}
    final["images"] = {tag for tag in shown["images"] if tag.startswith(f"{IMAGES_GROUP}/")}
    assert final["images"] and set(shown["text"]) >= final["text"]  # the pictures do show one
    drawn = {kind: set(tags) for kind, tags in shots.tags_of(watched_sweep).items()}
    assert drawn == {kind: set(shown[kind]) - final[kind] for kind in shown}
    # the documented sweep's Images tab opens on the grids, its Text tab on the command, its metrics on results
    assert tb_group_order(shown["images"]) == ["samples", IMAGES_GROUP]
    assert sorted(shown["images"])[:2] == [FAKE_TAG, REAL_TAG]
    assert sorted(shown["text"]) == ["run/command", "run/config", "run/environment", METRICS_TEXT_TAG]
    assert sorted(shown["scalars"])[:2] == [BEST_FID_TAG, FINAL_FID_TAG]
