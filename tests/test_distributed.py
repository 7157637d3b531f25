"""DDP on the CPU: 2 processes with gloo, launched the way users launch them (torchrun)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import ROOT, TINY, compose_config, run_train
from test_checkpoints import assert_same_state, run_until
from torch.nn.parallel import DistributedDataParallel

import gan.torchrun
from gan.checkpoint import load_checkpoint
from gan.core.steps import d_step, g_step
from gan.data import EpochBatchSampler
from gan.training.state import build_models, build_optimizer
from scripts.tensorboard_screenshots import free_port


def torchrun(*overrides: str, cwd: Path, launcher: str = "torch.distributed.run") -> subprocess.Popen:
    """`torchrun --nproc_per_node=2 train.py` (torchrun's module), or gan.torchrun's; stdout holds stderr too."""
    args = [sys.executable, "-m", launcher, "--standalone", "--nproc_per_node=2", f"{ROOT}/train.py", *TINY, *overrides]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(args, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen, before: tuple[str, ...] = ()) -> tuple[int, str]:
    """The job's exit code and its whole output (`before`: the lines already read)."""
    output, _ = process.communicate(timeout=240)
    return process.returncode, "".join(before) + (output or "")


def ddp_job(*overrides: str, cwd: Path) -> None:  # a 2-process torchrun job of train.py that must succeed
    code, output = finish(torchrun("trainer.checkpoint_every=100", *overrides, cwd=cwd))
    assert code == 0, output[-3000:]


def one_step_worker(rank: int, port: int, result_file: str) -> None:  # one step, then every weight across ranks
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)  # different initial weights and data per rank: DDP must reconcile them
    cfg, cpu = compose_config(), torch.device("cpu")
    G, D = build_models(cfg, cpu)
    G_train, D_train = DistributedDataParallel(G), DistributedDataParallel(D)  # as train() wraps them
    opt_g, opt_d = build_optimizer(G, cfg, cpu), build_optimizer(D, cfg, cpu)
    real = torch.rand(8, 1, 16, 16) * 2 - 1
    fake = G_train(torch.randn(8, cfg.model.z_dim))
    _, features = d_step(D_train, opt_d, real, fake)
    g_step(D, G, opt_g, fake, features)  # the unwrapped, frozen D, as train() does
    weights = torch.cat([p.detach().flatten() for p in [*G.parameters(), *D.parameters()]])
    gathered = [torch.empty_like(weights) for _ in range(2)]
    dist.all_gather(gathered, weights)
    if rank == 0:
        torch.save({"same": torch.equal(*gathered), "changed": bool(weights.any())}, result_file)
    dist.destroy_process_group()


def test_ranks_take_disjoint_shares_of_the_same_epoch_order():
    shares = [list(EpochBatchSampler(100, 10, seed=3, rank=r, world_size=2)) for r in range(2)]
    assert [len(share) for share in shares] == [5, 5]
    flat = [sum(share, []) for share in shares]
    single = sum(list(EpochBatchSampler(100, 10, seed=3)), [])
    assert not set(flat[0]) & set(flat[1]) and sorted(flat[0] + flat[1]) == sorted(single)  # together: one epoch


@pytest.mark.slow  # two processes, one per rank
def test_replicas_hold_identical_weights_after_one_step(tmp_path):
    result_file = tmp_path / "result.pt"
    mp.spawn(one_step_worker, args=(free_port(), str(result_file)), nprocs=2, join=True)
    assert torch.load(result_file) == {"same": True, "changed": True}


@pytest.mark.slow  # torchrun
def test_a_ddp_run_writes_one_run_dir_and_resumes_alone_and_back_under_ddp_keeping_the_ranks_apart(tmp_path):
    ddp_job("trainer.max_steps=4", cwd=tmp_path)
    [run_dir] = [p.parent.parent for p in tmp_path.glob("**/last.pt")]
    assert [p.parent for p in tmp_path.glob("outputs/*/*/.hydra")] == [run_dir]
    assert not (tmp_path / ".hydra").exists()  # rank 1 ran Hydra in '.' without writing its files
    state = load_checkpoint(run_dir)
    assert state["step"] == 4 and not any(key.startswith("module.") for key in state["G"])  # unwrapped state dicts
    single = run_train(f"trainer.resume={run_dir}", "trainer.max_steps=6", cwd=tmp_path)
    assert single.returncode == 0, single.stderr[-3000:]
    assert load_checkpoint(run_dir)["step"] == 6 and load_checkpoint(run_dir)["rng_ranks"] == []
    # without one generator state per rank, rank 0 takes the saved one, the others keep their seeds: no two draw alike
    ddp_job(f"trainer.resume={run_dir}", "trainer.max_steps=8", cwd=tmp_path)
    ranks = (state := load_checkpoint(run_dir))["rng_ranks"]
    assert state["step"] == 8 and len(ranks) == 2 and not torch.equal(ranks[0]["torch"], ranks[1]["torch"])


@pytest.mark.slow
def test_a_ddp_run_resumes_exactly_with_each_ranks_own_generators(tmp_path):
    """Each rank draws its own latents (seed + rank), each rank's generators saved: 3 steps + 3 resumed = 6 straight."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    ddp_job("trainer.max_steps=6", f"hydra.run.dir={straight}", cwd=tmp_path)
    ddp_job("trainer.max_steps=3", f"hydra.run.dir={split}", cwd=tmp_path)
    ddp_job("trainer.max_steps=6", f"trainer.resume={split}", cwd=tmp_path)
    assert_same_state(load_checkpoint(straight), load_checkpoint(split))


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher, override, code, said",
    [  # gan.torchrun exits 2 as a single process does; torchrun itself exits 1 after its ChildFailedError summary
        ("gan.torchrun", "trainer.max_steps=0", 2, "trainer.max_steps=0 must be at least 1"),
        ("torch.distributed.run", "trainer.max_steps=0", 1, "trainer.max_steps=0 must be at least 1"),
        ("gan.torchrun", "trainer.nosuch=1", 2, "Could not override 'trainer.nosuch'"),  # Hydra's refusal
    ],
)
def test_a_refusal_under_torchrun_is_said_once_without_a_traceback_from_this_project(
    tmp_path, launcher, override, code, said
):
    returncode, output = finish(torchrun(override, cwd=tmp_path, launcher=launcher))
    assert returncode == code and output.count(said) == 1, output[-3000:]
    assert "/gan/" not in output and 'train.py", line' not in output  # no frame of this project
    assert ("Traceback" in output) == (launcher != "gan.torchrun") and not (tmp_path / "outputs").exists()


def long_job(tmp_path: Path, launcher: str, checkpoint_every: int, until: str) -> tuple[subprocess.Popen, tuple]:
    """A job with no end in sight, into tmp_path/run, and its lines up to the first holding `until`."""
    overrides = ("trainer.max_steps=100000", f"trainer.checkpoint_every={checkpoint_every}")
    process = torchrun(*overrides, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, launcher=launcher)
    return process, run_until(process, until)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torch.distributed.run", "gan.torchrun"])
def test_sigterm_to_the_job_checkpoints_every_rank(tmp_path, launcher):
    process, lines = long_job(tmp_path, launcher, checkpoint_every=100000, until="step 4 ")
    process.send_signal(signal.SIGTERM)  # to the launcher alone, which passes it on to every rank
    code, output = finish(process, lines)
    assert "Stopped by SIGTERM" in output, output[-3000:]
    assert load_checkpoint(tmp_path / "run")["step"] >= 4
    if launcher == "gan.torchrun":  # said once, and the exit code of a process that SIGTERM ended
        assert code == 143 and output.count("Stopped by SIGTERM") == 1 and "Traceback" not in output, output[-3000:]


@pytest.mark.slow
def test_a_rank_killed_by_sigkill_ends_the_job_without_a_traceback_saying_what_is_kept(tmp_path):
    process, lines = long_job(tmp_path, "gan.torchrun", checkpoint_every=2, until="step 6 ")
    run_dir = tmp_path / "run"
    ranks = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
    os.kill(int(max(ranks, key=int)), signal.SIGKILL)  # the younger of the two: rank 1
    code, output = finish(process, lines)
    assert code == 137 and "Traceback" not in output, output[-3000:]  # 128 + 9, as a shell reports SIGKILL
    assert (step := load_checkpoint(run_dir)["step"]) >= 4  # step 4's checkpoint at least (step 6's log line first)
    # rank 0 says so when its collective reports the lost peer; one blocked in gloo until torchrun's SIGKILL, silently
    said = [line for line in output.splitlines() if "Another process of this torchrun job ended" in line]
    assert all(f"{run_dir / 'checkpoints' / 'last.pt'} holds step {step}" in line for line in said) and len(said) <= 1


@pytest.mark.parametrize("count", ["0", "-1", "abc"])
def test_a_process_count_torchrun_cannot_use_is_one_paragraph(count, capsys):
    assert gan.torchrun.main([f"--nproc_per_node={count}", "train.py"]) == 2
    said = capsys.readouterr().err
    assert f"--nproc_per_node={count}: the number of processes per node must be" in said and "Traceback" not in said
