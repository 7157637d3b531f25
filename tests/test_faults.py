"""Nothing lost, nothing silent: one paragraph and an exit code each (2 bad input, 3 non-finite, 130/143 signals)."""

from __future__ import annotations

import contextlib
import errno
import math
import multiprocessing
import os
import resource
import shutil
import signal
import subprocess
import sys
from types import SimpleNamespace
from unittest.mock import Mock

import conftest
import pytest
import torch
from conftest import ROOT, TINY, compose_config, output_of, run_train
from tensorboard.compat.tensorflow_stub.io.gfile import LocalFileSystem
from test_checkpoints import nan_after, run_until
from test_datasets import write_image
from test_distributed import finish

from gan.checkpoint import load_checkpoint
from gan.data.stream import BatchStream
from gan.errors import ConfigError, environment_error
from gan.run import Run
from gan.training import NonFiniteLossError, train
from gan.training.faults import NonFiniteWatch, NonFiniteWeightsError, check_finite_state
from gan.training.monitor import Monitor
from gan.world import SINGLE

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_dataloader_workers_outlive_a_stop_signal(sig):
    # Ctrl-C and `kill -- -PGID` reach every process of the group; the main process handles them.
    images = torch.randint(0, 256, (64, 1, 16, 16), dtype=torch.uint8)
    stream = BatchStream(images, batch_size=8, seed=0, device=torch.device("cpu"), num_workers=1)
    next(stream)  # the worker is up and ran its init
    assert (workers := multiprocessing.active_children())
    for worker in workers:
        os.kill(worker.pid, sig)
    for _ in range(12):  # past prefetched batches and an epoch boundary
        assert next(stream).shape == (8, 1, 16, 16)
    assert all(worker.is_alive() for worker in workers)


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_process_group_checkpoints_a_streamed_run(tmp_path, sig, code):
    images, run_dir = tmp_path / "images", tmp_path / "run"
    for i in range(300):
        write_image(images / f"{i:04d}.png", (16, 16), seed=i)
    streamed = ["data=folder", f"data.root={images}", "data.image_size=16", "data.channels=3"]
    streamed += ["data.in_memory=false", "data.num_workers=1"]
    long_run = ["trainer.max_steps=100000", "trainer.checkpoint_every=100000", "trainer.log_every=1"]
    args = [sys.executable, str(ROOT / "train.py"), *TINY, *streamed, *long_run, f"hydra.run.dir={run_dir}"]
    # its own session, as a terminal or a batch scheduler starts a job: the signal goes to the group
    process = subprocess.Popen(
        args, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        lines = run_until(process, "step 3 ")  # training is under way
        os.killpg(process.pid, sig)
        returncode, output = finish(process, lines)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert returncode == code, output[-3000:]
    assert f"Stopped by {sig.name}" in output and "Traceback" not in output
    assert 3 <= (stopped_at := load_checkpoint(run_dir)["step"]) < 100000
    resumed = run_train(f"trainer.resume={run_dir}", f"trainer.max_steps={stopped_at + 2}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert load_checkpoint(run_dir)["step"] == stopped_at + 2


def test_an_infinite_learning_rate_stops_before_any_checkpoint(tmp_path):
    # step 1's losses are finite, its update is not: 1e39 is a finite setting, above float32's range
    cfg = compose_config("optim.lr=1e39", "optim.lr_d=2e-4", "trainer.checkpoint_every=1")
    with pytest.raises(NonFiniteWeightsError) as caught:
        train(cfg, tmp_path)
    assert all(part in str(caught.value) for part in ("at step 1: G in", "net.0.weight", "had written none yet"))
    assert not (tmp_path / "checkpoints" / "last.pt").exists()


def test_non_finite_weights_keep_the_last_good_checkpoint_even_with_on_nan_skip(tmp_path, tiny_run):
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    before = (run_dir / "checkpoints" / "last.pt").read_bytes()
    diverge = ["optim.lr=1e39", "optim.lr_d=2e-4", "trainer.checkpoint_every=1", "trainer.on_nan=skip"]
    result = run_train(f"trainer.resume={run_dir}", "trainer.max_steps=8", *diverge, cwd=tmp_path)
    output = output_of(result)
    assert result.returncode == 3, output[-3000:]
    assert "Traceback" not in output and "Non-finite weights at step 7" in output
    assert "keeps step 6, the last good one" in output and "trainer.on_nan=skip cannot help" in output
    assert (run_dir / "checkpoints" / "last.pt").read_bytes() == before


def test_a_non_finite_optimizer_statistic_is_caught_and_named_and_huge_weights_pass(tmp_path, tiny_gan, caplog):
    G, D = tiny_gan
    opt_g, opt_d = (torch.optim.Adam(module.parameters()) for module in (G, D))  # with state, as a run's
    for module, opt in ((G, opt_g), (D, opt_d)):
        for p in module.parameters():
            p.grad = torch.full_like(p, 1e-3)
        opt.step()
    state = SimpleNamespace(G=G, D=D, G_ema=None, opt_g=opt_g, opt_d=opt_d, step=7)
    with torch.no_grad():
        for p in G.parameters():
            p.fill_(1e30)  # their 2-norm overflows float32; they are still finite
    check_finite_state(state, tmp_path / "last.pt")
    assert "G's weights have diverged (largest |weight| 1e+30" in caplog.text  # reported, the checkpoint written
    assert "D's weights" not in caplog.text  # N(0, 0.02) weights and BatchNorm scales near 1
    name, first = next(iter(D.named_parameters()))
    state.opt_d.state[first]["exp_avg_sq"].fill_(float("inf"))  # a huge gradient, squared
    with pytest.raises(NonFiniteWeightsError) as caught:
        check_finite_state(state, tmp_path / "last.pt")
    message = str(caught.value)
    assert "step 7: opt_d in 1 of its" in message and f"exp_avg_sq of D.{name}" in message
    assert message.split(". ")[0].count(" in ") == 1  # opt_d alone: G's huge weights are finite


def test_evaluate_refuses_a_generator_with_non_finite_weights(tmp_path, tiny_run):
    checkpoint, state = tmp_path / "diverged.pt", torch.load(tiny_run / "checkpoints" / "last.pt", weights_only=True)
    for tensor in [*state["G"].values(), *state["G_ema"].values()]:
        if tensor.is_floating_point():
            tensor.fill_(float("nan"))
    torch.save(state, checkpoint)
    result = conftest.run_evaluate("device=cpu", "threads=1", f"checkpoint={checkpoint}", f"hydra.run.dir={tmp_path}/e")
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"The EMA generator in {checkpoint} holds NaN or inf" in output and "net.0.weight" in output
    assert "Traceback" not in output and not (tmp_path / "e" / "metrics.json").exists()


@pytest.mark.parametrize("program", ["train.py", "evaluate.py"])
def test_hydra_does_not_overwrite_the_record_of_an_existing_run(tmp_path, tiny_run, program):
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    record = {p: p.read_bytes() for p in (run_dir / ".hydra").iterdir()}
    if program == "train.py":
        result = run_train(f"hydra.run.dir={run_dir}", "loss=hinge", cwd=tmp_path)
    else:
        result = conftest.run_evaluate("device=cpu", "threads=1", f"checkpoint={run_dir}", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2, output_of(result)[-3000:]
    assert {p: p.read_bytes() for p in record} == record


@pytest.mark.slow  # a process with a file-size limit: the disk it sees fills up
def test_a_full_disk_at_checkpoint_time_keeps_the_last_checkpoint(tmp_path, tiny_run):
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    before = (run_dir / "checkpoints" / "last.pt").read_bytes()

    def small_files_only():  # the tiny checkpoint is ~160 kB; logs, samples and events stay below
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))

    args = [sys.executable, str(ROOT / "train.py"), *TINY, f"trainer.resume={run_dir}", "trainer.max_steps=8"]
    result = subprocess.run(
        args, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=240, preexec_fn=small_files_only
    )
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"{run_dir / 'checkpoints' / 'last.pt'}: File too large" in output
    assert "Traceback" not in output and (run_dir / "checkpoints" / "last.pt").read_bytes() == before
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))


def test_only_an_allocation_failure_becomes_a_config_error_naming_the_size_settings(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as caught:  # a ConfigError: exit code 2, one paragraph (test_config.py)
        train(compose_config("model.g_width=1000000000000"), tmp_path / "big")
    message = str(caught.value)
    assert "Not enough memory to build the models" in message and "model.g_width=1000000000000" in message
    assert "trainer.num_fixed_samples=" in message and "bytes" in message
    monkeypatch.setattr("gan.training.state.build_state", Mock(side_effect=RuntimeError("a bug, not an allocation")))
    with pytest.raises(RuntimeError, match="a bug"):  # a bug keeps its traceback
        train(compose_config(), tmp_path / "bug")


def test_a_nan_at_step_one_claims_no_checkpoint_that_does_not_exist(tmp_path, monkeypatch):
    nan_after(1, monkeypatch)  # the bce G loss is NaN from its first call
    with pytest.raises(NonFiniteLossError) as caught:
        train(compose_config("trainer.max_steps=4"), tmp_path)
    message, last = str(caught.value), tmp_path / "checkpoints" / "last.pt"
    assert message.startswith("Non-finite loss at step 1: ") and "loss/g=nan." in message
    assert f"this run had written none yet ({last} does not exist)" in message and not last.exists()
    assert "Lower optim.lr (set to 0.001: the step size of G and D), try loss=hinge" in message
    assert "optim.lr_d" not in message and "trainer.on_nan=skip" in message  # optim.lr_d: not set in this run
    # a hinge run (not patched) that wrote last.pt at step 2, both rates set: the message names that step and both
    cfg = compose_config("trainer.max_steps=2", "optim.lr_d=0.0004", "loss=hinge")
    train(cfg, tmp_path / "hinge")
    watch = NonFiniteWatch(torch.device("cpu"), last := tmp_path / "hinge" / "checkpoints" / "last.pt", cfg)
    watch.update(3, torch.tensor(0.7), torch.tensor(math.nan))
    with pytest.raises(NonFiniteLossError) as caught:
        watch.check()
    message = str(caught.value)
    assert message.startswith("Non-finite loss at step 3: loss/d=0.699999988079071, loss/g=nan.")
    assert f"{last} keeps step 2, the last good one." in message
    assert "Lower optim.lr (set to 0.001: G's step size) or optim.lr_d (set to 0.0004: D's)" in message
    assert "loss=hinge" not in message  # this run already uses it


FAILED_WRITES = {  # the OSError, the file the message names, what it says to do
    "full disk, bytes path": (OSError(errno.ENOSPC, "No space left on device", b"/r/tb/ev"), "/r/tb/ev", "Free disk"),
    "read-only mount": (OSError(errno.EROFS, "Read-only file system", "/r/x"), "/r/x", "mounted read-only"),
    "file size limit": (OSError(errno.EFBIG, "File too large", "/r/c.pt"), "/r/c.pt", "ulimit -f"),
    "no permission": (PermissionError(errno.EACCES, "Permission denied", "/r/s"), "/r/s", "write permission"),
}


@pytest.mark.parametrize("case", FAILED_WRITES)
def test_a_failed_write_names_the_file_its_cause_and_what_to_do(case):
    err, named, fix = FAILED_WRITES[case]
    message = str(environment_error(err))
    assert message.startswith(f"Cannot use {named}: {err.strerror}") and fix in message and "b'" not in message


def test_a_full_disk_under_tensorboard_names_the_events_file_without_the_writer_threads_traceback(
    tmp_path, monkeypatch, capfd
):
    monitor = Monitor(Run(tmp_path), 0, compose_config("trainer.progress=false"), SINGLE, None)
    monitor.numbers(1, {"loss/d": 1.0})  # the events file opens at the first write
    full = OSError(errno.ENOSPC, "No space left on device")  # as gfile reports it: no file named
    monkeypatch.setattr(LocalFileSystem, "append", Mock(side_effect=full))
    monitor.numbers(2, {"loss/d": 1.0})
    with pytest.raises(OSError) as caught:
        monitor.close()  # the writer thread's failure comes back here
    assert caught.value.filename == str(monitor.events) and monitor.events.parent == tmp_path / "tb"
    assert "Traceback" not in capfd.readouterr().err
