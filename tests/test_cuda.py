"""The CUDA-only paths, skipped without a GPU (the `cuda` marker); precision and compile: test_training.py's tables.
`pytest -m cuda` runs these alone on a machine with a GPU; `GAN_TEST_DEVICE=cuda pytest` runs all training there."""

import copy
import dataclasses

import pytest
import torch
from conftest import compose_config, run_train
from test_checkpoints import assert_same_state
from test_evaluate import TINY_EVAL, run_evaluate
from torch.utils._pytree import tree_leaves

from gan.checkpoint import load_checkpoint
from gan.config import Precision
from gan.core.losses import LOSSES
from gan.core.models import Discriminator, Generator
from gan.core.steps import d_step
from gan.data.stream import BatchStream
from gan.training import train
from gan.training.state import prepare_process, step_context

pytestmark = pytest.mark.cuda

CUDA = "trainer.device=cuda"


def test_the_grad_scaler_skips_a_step_whose_gradients_overflow_and_backs_off():
    # fp16 ends at 65504: a scale of 2**40 overflows the gradients (not the loss), the step is skipped, the scale halved
    device = torch.device("cuda")
    torch.manual_seed(0)
    G, D = Generator(16, 8, 1, 16).to(device), Discriminator(8, 1, 16).to(device)
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    ctx = step_context(Precision.fp16, device, skip_nonfinite=False)
    ctx = dataclasses.replace(ctx, loss=LOSSES["bce"], scaler=torch.amp.GradScaler("cuda", init_scale=2.0**40))
    real = torch.rand(32, 1, 16, 16, device=device) * 2 - 1
    with ctx.autocast():
        fake = G(torch.randn(32, 16, device=device))
    before = copy.deepcopy(D.state_dict())
    stats, _ = d_step(D, opt_d, real, fake, ctx)
    ctx.scaler.update()
    assert torch.isfinite(stats["loss/d"]) and ctx.scaler.get_scale() == 2.0**39  # only the gradients overflowed; 0.5x
    assert all(torch.equal(before[k], v) for k, v in D.state_dict().items() if k.endswith("weight"))
    ctx = dataclasses.replace(ctx, scaler=torch.amp.GradScaler("cuda"))  # 65536: fits
    d_step(D, opt_d, real, fake, ctx)
    ctx.scaler.update()
    assert not torch.equal(before["features.0.weight"], D.state_dict()["features.0.weight"])


def test_deterministic_runs_are_identical_and_resume_bit_exactly_and_the_cudnn_autotuner_is_on_otherwise(tmp_path):
    """Deterministic mode on the GPU: two straight runs of 12 steps give the same bits, and so does 5 + a resume to
    12 (the CUDA generator's state is in the checkpoint): weights, EMA, Adam moments and the data position."""
    try:
        prepare_process(compose_config(CUDA))
        assert torch.backends.cudnn.benchmark
        prepare_process(compose_config(CUDA, "trainer.deterministic=true"))
        assert not torch.backends.cudnn.benchmark and torch.are_deterministic_algorithms_enabled()
    finally:  # prepare_process switches deterministic algorithms on for the whole process: switch back
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.benchmark = False
    common = (CUDA, "trainer.deterministic=true", "trainer.checkpoint_every=100")
    runs = [(tmp_path / "a", 12, ()), (tmp_path / "b", 12, ()), (tmp_path / "split", 5, ())]
    for run_dir, steps, extra in [*runs, (tmp_path / "split", 12, (f"trainer.resume={tmp_path / 'split'}",))]:
        result = run_train(*common, f"trainer.max_steps={steps}", *extra, f"hydra.run.dir={run_dir}")
        assert result.returncode == 0, result.stderr[-3000:]
    resumed = load_checkpoint(tmp_path / "split")
    assert resumed["rng"]["cuda"], "the CUDA generator's state must be saved"
    assert_same_state(load_checkpoint(tmp_path / "a"), load_checkpoint(tmp_path / "b"))
    assert_same_state(load_checkpoint(tmp_path / "a"), resumed)


def test_a_cuda_checkpoint_loads_on_the_cpu_and_evaluates_there(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train(CUDA, "data.num_samples=1200", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    state = load_checkpoint(run_dir)  # map_location="cpu" by default
    assert {t.device.type for t in tree_leaves(state) if isinstance(t, torch.Tensor)} == {"cpu"}  # fixed_z among them
    out, data = tmp_path / "eval", f"data.root={tmp_path / 'data'}"
    evaluated = run_evaluate(f"checkpoint={run_dir}", data, *TINY_EVAL, f"hydra.run.dir={out}")
    assert evaluated.returncode == 0 and (out / "metrics.json").is_file(), evaluated.stderr[-3000:]


@pytest.mark.parametrize("first, then", [("cpu", "cuda"), ("cuda", "cpu")])
def test_a_run_moves_between_cpu_and_cuda_on_resume(tmp_path, first, then):  # trainer.device is a runtime key
    train(compose_config(f"trainer.device={first}", "trainer.max_steps=3"), tmp_path)
    resumed = compose_config(f"trainer.device={then}", "trainer.max_steps=6", f"trainer.resume={tmp_path}")
    result, state = train(resumed, tmp_path), load_checkpoint(tmp_path)
    assert result.step == 6 and state["step"] == 6
    assert all(torch.isfinite(t).all() for t in state["G"].values() if t.is_floating_point())


def test_pinned_worker_batches_equal_the_device_resident_ones_and_a_worker_fed_run_trains(tmp_path):
    # workers on CUDA: pinned host memory and non_blocking copies, the batches of the uint8 tensor on the GPU
    device, images = torch.device("cuda"), torch.randint(0, 256, (96, 1, 8, 8), dtype=torch.uint8)
    resident = BatchStream(images, 16, seed=0, device=device, num_workers=0)
    pinned = BatchStream(images, 16, seed=0, device=device, num_workers=2)
    assert resident.images is not None and resident.images.device.type == "cuda"
    for _ in range(8):  # across an epoch boundary (6 batches an epoch)
        a, b = next(resident), next(pinned)
        assert a.device.type == b.device.type == "cuda" and torch.equal(a, b)
    pinned.close()
    result = train(compose_config(CUDA, "data.num_workers=2"), tmp_path)
    assert result.step == 6 and load_checkpoint(tmp_path)["data"] == {"epoch": 0, "batch": 6}


# the walkthrough's "On CUDA" statements
def test_mixing_cuda_and_cpu_tensors_names_both_devices():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(2, device="cuda") + torch.ones(2)
    assert (torch.ones(2, device="cuda") + torch.tensor(1.0)).device.type == "cuda"  # 0-dim CPU: a number


def test_cuda_autocast_refuses_binary_cross_entropy_on_probabilities():
    probabilities, target = torch.rand(4, device="cuda"), torch.ones(4, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            torch.nn.functional.binary_cross_entropy(probabilities, target)
        logits = torch.randn(4, device="cuda")
        assert torch.isfinite(torch.nn.functional.binary_cross_entropy_with_logits(logits, target))


def test_cpu_of_a_cuda_tensor_is_a_copy_so_numpy_is_a_snapshot():
    weight = torch.nn.Parameter(torch.zeros(3, device="cuda"))
    snapshot = weight.detach().cpu().numpy()
    with torch.no_grad():
        weight.add_(1.0)
    assert snapshot.tolist() == [0.0, 0.0, 0.0]  # on the CPU the same line would show the new values
