"""Bad input through the real CLI: each case ends with one clear paragraph and a non-zero exit, never
a traceback, and nothing that was good before is changed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import run_train


@pytest.fixture(scope="module")
def good_checkpoint(tiny_run) -> dict:
    return torch.load(tiny_run / "checkpoints" / "last.pt", weights_only=True)


def damaged(state: dict, entry: str, value: object) -> dict:
    copy = dict(state)
    if value is KeyError:
        del copy[entry]
    else:
        copy[entry] = value
    return copy


@pytest.mark.parametrize(
    "entry, value",
    [
        ("opt_g", KeyError),  # missing
        ("opt_d", {"state": {}, "param_groups": "not a list"}),  # wrong type
        ("data", {"epoch": "x", "batch": 0}),
        ("rng", {"python": (3, (1, 2), None), "torch": torch.zeros(3, dtype=torch.uint8), "cuda": []}),
        ("fixed_z", torch.zeros(5)),
    ],
)
def test_a_damaged_checkpoint_entry_is_named(good_checkpoint, tmp_path, entry, value):
    path = tmp_path / "damaged.pt"
    torch.save(damaged(good_checkpoint, entry, value), path)
    result = run_train(f"trainer.resume={path}", "trainer.max_steps=8", f"hydra.run.dir={tmp_path / 'run'}")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output and re.search(rf"entry '{entry}' is (missing|damaged)", output)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_sweep_reports_a_bad_job_without_a_traceback_and_runs_the_others(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = run_train("-m", "optim.lr=-1,1e-4", "trainer.max_steps=2", f"hydra.sweep.dir={sweep_dir}")
    output = result.stdout + result.stderr
    assert result.returncode != 0  # Hydra ends a sweep with a failed job with exit 1
    assert "optim.lr=-1.0 must be > 0." in output and "Traceback" not in output
    finished = list(Path(sweep_dir).glob("*/checkpoints/last.pt"))
    assert len(finished) == 1 and "optim.lr=0.0001" in str(finished[0])


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux's /proc, a folder no file can be created in")
def test_a_run_dir_that_cannot_be_created_is_refused_before_hydra(tmp_path):
    # os.access says /proc is writable to root, yet nothing can be created in it: the pre-check must try
    target = Path("/proc") / "dcgan-reference-run"
    result = run_train(f"hydra.run.dir={target}", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output
    assert f"Cannot write the run directory {target}" in output
