"""Watching a run: how a sweep's jobs are named, so TensorBoard's run list shows what differs."""

from __future__ import annotations

from conftest import ROOT

from gan.training.runs import EXCLUDE_KEYS, sweep_argv


def test_sweep_argv_excludes_the_overrides_that_do_not_vary():
    argv = ["train.py", "-m", "optim.lr=1e-4,4e-4", "loss=bce,hinge", "trainer.threads=1", "+data.seed=3",
            "hydra.sweep.dir=/tmp/x"]  # fmt: skip
    added = sweep_argv(argv, ROOT / "configs")[len(argv) :]
    assert len(added) == 1 and added[0].startswith(f"{EXCLUDE_KEYS}=[")
    excluded = added[0].split("=", 1)[1]
    assert "'trainer.threads'" in excluded and "'data.seed'" in excluded and "'trainer.resume'" in excluded
    assert "optim.lr" not in excluded and "'loss'" not in excluded and "hydra.sweep.dir" not in excluded
    single = ["train.py", "optim.lr=1e-4", "trainer.threads=1"]
    assert sweep_argv(single, ROOT / "configs") == single  # not a sweep
    chosen = ["train.py", "-m", "optim.lr=1e-4,4e-4", f"{EXCLUDE_KEYS}=[debug]"]
    assert sweep_argv(chosen, ROOT / "configs") == chosen  # the user's own list wins
