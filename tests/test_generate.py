"""generate.py: images from a checkpoint into PNGs and samples.npz, with no dataset; bad input refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_checkpoint
from PIL import Image
from test_launch import run

import gan
from gan.evaluation.pipeline import to_uint8


def test_generate_writes_pngs_and_the_npz_and_draws_the_class_asked_for(tiny_run, tmp_path, one_thread):
    given = ("num=10", "out=images", "batch_size=4", "device=cpu")
    result = run("generate.py", f"checkpoint={tiny_run}", *given, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    pngs = sorted((tmp_path / "images").glob("*.png"))
    assert [p.name for p in pngs] == [f"{i:06d}.png" for i in range(10)]
    with np.load(tmp_path / "images" / "samples.npz") as saved:
        images = saved["arr_0"]
    assert images.dtype == np.uint8 and images.shape == (10, 16, 16, 1)  # N x H x W x C
    np.testing.assert_array_equal(np.asarray(Image.open(pngs[3])), images[3, ..., 0])
    # the images of gan.sample with the same seed: batches of 4 draw the latents of one batch of 10
    expected = to_uint8(gan.sample(gan.load_generator(tiny_run), 10, seed=0)).permute(0, 2, 3, 1)
    np.testing.assert_array_equal(images, expected.numpy())
    # a conditional G; device=cpu, as gan.load_generator's (on an H200, generate.py's cuda rounded up to 20 levels off)
    checkpoint = tiny_checkpoint(tmp_path, "model.conditional=true")
    given = ("num=6", "class_id=3", "seed=5", "out=threes", "device=cpu")
    result = run("generate.py", f"checkpoint={checkpoint}", *given, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(tmp_path / "threes" / "samples.npz") as saved:
        images = torch.from_numpy(saved["arr_0"]).permute(0, 3, 1, 2)
    G = gan.load_generator(checkpoint)
    torch.testing.assert_close(images, to_uint8(gan.sample(G, 6, seed=5, classes=torch.full((6,), 3))))
    assert not torch.equal(images, to_uint8(gan.sample(G, 6, seed=5, classes=torch.full((6,), 4))))


REFUSALS = {  # a missing checkpoint: test_checkpoints (load_checkpoint refuses it, for every program)
    "num=0": (["num=0"], "num=0 must be at least 1"),
    "class_id unconditional": (["class_id=1"], "holds an unconditional generator"),
    "class_id out of range": (["class_id=10", "CONDITIONAL"], "class_id=10 is out of range"),
    "out is a file": (["out=afile"], "afile is not a directory"),
    "out holds images": (["out=done"], "already holds generated images"),
}


@pytest.mark.parametrize(("argv", "said"), REFUSALS.values(), ids=REFUSALS.keys())
def test_bad_input_is_one_paragraph_exit_2_and_nothing_written(tiny_run, argv, said, tmp_path):
    (tmp_path / "afile").write_text("")
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "samples.npz").write_bytes(b"")
    checkpoint = tiny_checkpoint(tmp_path, "model.conditional=true") if "CONDITIONAL" in argv else tiny_run
    before, given = sorted(tmp_path.rglob("*")), dict(a.split("=", 1) for a in argv if a != "CONDITIONAL")
    argv = [f"{key}={value}" for key, value in {"checkpoint": checkpoint, "out": "out", **given}.items()]
    result = run("generate.py", *argv, cwd=tmp_path)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2 and said in output, output[-3000:]
    assert "Traceback" not in output and len(output.splitlines()) == 1
    assert sorted(tmp_path.rglob("*")) == before
