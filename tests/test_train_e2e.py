"""End-to-end tier: the real train.py and the real TensorBoard, on a tiny config in tmp_path."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from unittest.mock import Mock

import pytest
import torch
from conftest import compose_config, in_process, output_of, run_train
from PIL import Image
from test_run import unused_pid
from test_watching import LOSS_CHARTS, TensorBoardClient, events_of

import train as train_py
from gan.checkpoint import load_checkpoint
from gan.errors import MetricsError
from gan.training import train
from gan.training.loop import what_is_kept
from scripts.tensorboard_screenshots import free_port

# the names the log line, TensorBoard and TrainResult.metrics use (docs/watching.md says what each is)
TRAIN_TAGS = {"train/D(G(z))_after_d_step", "train/d_overfit_rt", "train/augment_p", "train/d_won", "train/lr_g"}
GRAD_NORMS = {"train/grad_norm_d", "train/grad_norm_g", "train/grad_norm_images"}
EXPECTED_SCALARS = {*LOSS_CHARTS, *TRAIN_TAGS, *GRAD_NORMS, "train/lr_d", "time/img_per_s", "time/sec_per_kimg"}


def test_checkpoint_is_a_plain_dict_loadable_weights_only(tiny_run):
    state = torch.load(tiny_run / "checkpoints" / "last.pt", weights_only=True)
    assert {"G", "D", "opt_g", "opt_d", "step", "config", "fixed_z", "rng", "data"} <= set(state)
    assert state["step"] == 6 and state["fixed_z"].shape == (16, 16) and state["config"]["data"]["image_size"] == 16
    assert state["config"]["loss"]["name"] == "bce"  # plain containers, enums as strings
    # and the rest of the run's folder: its record, events, sample grids and their animation
    assert (tiny_run / ".hydra" / "config.yaml").is_file()
    assert list((tiny_run / "tb").glob("events.out.tfevents.*"))
    samples = tiny_run / "samples"
    assert sorted(p.name for p in samples.glob("*.png")) == ["step_000003.png", "step_000006.png"]
    with Image.open(samples / "step_000006.png") as grid, Image.open(samples / "progress.gif") as gif:
        assert grid.size == gif.size == (4 * 18 + 2, 4 * 18 + 2)  # 16 fixed samples, 16 px, 2 px padding
        assert gif.n_frames == 2  # a frame per grid


@pytest.mark.slow
def test_tensorboard_server_serves_the_run_scalars(tiny_run):
    """The real `tensorboard` on a loopback port, read through its HTTP API as a browser would."""
    port = free_port()
    args = ["--logdir", str(tiny_run), "--host", "127.0.0.1", "--port", str(port), "--load_fast=false"]
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, runs = time.monotonic() + 90, []
        while time.monotonic() < deadline and "tb" not in runs:
            with contextlib.suppress(OSError):  # not up yet
                runs = json.load(urllib.request.urlopen(f"{base}/data/runs", timeout=5))
            time.sleep(0.5)
        assert "tb" in runs, runs
        query = urllib.parse.urlencode({"run": "tb", "tag": "loss/d"})
        points = json.load(urllib.request.urlopen(f"{base}/data/plugin/scalars/scalars?{query}", timeout=10))
        assert [step for _, step, _ in points] == [2, 4, 6]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_in_process_training_returns_the_logged_metrics(tmp_path):
    result = train(compose_config("trainer.max_steps=4"), tmp_path)
    assert result.step == 4 and result.stopped_by is None
    assert set(result.metrics) == EXPECTED_SCALARS  # time/threads only with trainer.adapt_threads=true
    assert 0 <= result.metrics["loss/D(x)"] <= 1


FINAL_EVAL_STOPS = {  # what the final evaluation raises -> exit code, what train.py says
    "Ctrl-C": (KeyboardInterrupt(), 130, "Interrupted (SIGINT) during the final evaluation. The run trained"),
    "classifier refused": (MetricsError("50%"), 2, "or set trainer.final_eval_samples=0 to train without the final"),
}


@pytest.mark.parametrize("stop, code, says", FINAL_EVAL_STOPS.values(), ids=FINAL_EVAL_STOPS.keys())
def test_a_final_evaluation_stopped_says_how_to_measure_the_saved_run(tmp_path, monkeypatch, stop, code, says):
    monkeypatch.setattr("gan.training.loop.evaluate", Mock(side_effect=stop))  # what final_evaluation measures with
    argv = ["debug=tiny", "trainer.final_eval_samples=100", f"hydra.run.dir={tmp_path / 'run'}"]
    result = in_process(train_py.main, argv, tmp_path)
    output = output_of(result)
    assert result.returncode == code and says in output and "Traceback" not in output, output[-2000:]
    assert f"python evaluate.py checkpoint={tmp_path / 'run'}" in output
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()


def test_a_resume_removes_dead_temp_files_leaves_a_damaged_grid_out_and_adds_its_command(tiny_run, tmp_path):
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    damaged, folder = run_dir / "samples" / "step_000003.png", run_dir / "checkpoints"
    damaged.write_bytes(b"not a png any more")
    dead, live = folder / f".last.pt.{unused_pid()}.tmp", folder / f".last.pt.{os.getppid()}.tmp"  # a live process
    for temp in (dead, live):  # a killed write leaves nothing behind
        temp.write_bytes(b"\0" * 1000)
    result = run_train(f"trainer.resume={run_dir}", "trainer.max_steps=9", cwd=tmp_path)
    output = output_of(result)
    assert result.returncode == 0, output[-3000:]
    assert not dead.exists() and live.exists() and f"Removed {dead}" in output
    assert load_checkpoint(run_dir)["step"] == 9 and not (tmp_path / "outputs").exists()  # in place: no new run dir
    events = events_of(run_dir / "tb")
    assert [e.step for e in events.Scalars("loss/d")] == [2, 4, 6, 8, 9]  # the same events go on, the last step too
    assert f"Left {damaged} out of progress.gif: it cannot be read as an image" in output
    assert damaged.read_bytes() == b"not a png any more"  # a grid of a step past the checkpoint is never rewritten
    with Image.open(run_dir / "samples" / "progress.gif") as gif:
        assert gif.n_frames == 2  # steps 6 and 9
    # its own command at the step it resumed from (event files read in name order: within a second, counters as text)
    entries = TensorBoardClient(run_dir).get("/data/plugin/text/text?run=tb&tag=run/command")
    entries.sort(key=lambda entry: entry["step"])
    assert [entry["step"] for entry in entries] == [0, 6]
    assert "trainer.max_steps=9" in entries[1]["text"] and "trainer.max_steps=9" not in entries[0]["text"]


def test_after_a_failed_write_train_py_says_whether_a_checkpoint_exists(tiny_run, tmp_path):
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    for written in (True, False):
        said = what_is_kept(run_dir)
        assert ("holds step 6" in said) == written and ("No checkpoint of this run was written" in said) != written
        (run_dir / "checkpoints" / "last.pt").unlink(missing_ok=True)
