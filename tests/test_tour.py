"""docs/tour.ipynb runs top to bottom and prints what its text says it shows.

The notebook is executed with nbclient in a kernel that runs this very interpreter (a kernel spec
written for the test, so a user-level `python3` kernel pointing at another Python cannot be picked
up). It needs the `docs` extra (nbclient, nbformat, ipykernel, matplotlib), which `test` pulls in.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbclient
import nbformat
import pytest
from ipykernel import kernelspec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

ROOT = Path(__file__).resolve().parents[1]
TOUR = ROOT / "docs" / "tour.ipynb"


def test_tour_is_stored_without_outputs_and_small():
    nb = nbformat.read(TOUR, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
    assert TOUR.stat().st_size < 100_000


def kernel_manager(tmp_path: Path) -> KernelManager:
    """A python3 kernel on sys.executable, with the repository importable even if not installed."""
    kernels = tmp_path / "kernels"
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    kernelspec.write_kernel_spec(kernels / "python3", overrides={"env": {"PYTHONPATH": path}})
    specs = KernelSpecManager(kernel_dirs=[str(kernels)], ensure_native_kernel=False)
    return KernelManager(kernel_name="python3", kernel_spec_manager=specs)


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> tuple[str, list[dict]]:
    """(every stream the notebook printed, every rich output), after running it top to bottom."""
    nb = nbformat.read(TOUR, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        km=kernel_manager(tmp_path_factory.mktemp("tour")),
        timeout=300,  # per cell; the whole notebook takes about half a minute on 2 cores
        resources={"metadata": {"path": str(ROOT / "docs")}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    outputs = [output for cell in nb.cells if cell.cell_type == "code" for output in cell.outputs]
    text = "".join(output.get("text", "") for output in outputs if output.output_type == "stream")
    return text, outputs


def number_after(label: str, text: str) -> float:
    match = re.search(re.escape(label) + r"\s*([-+0-9.e]+)", text)
    assert match, f"the notebook printed no {label!r}"
    return float(match.group(1))


@pytest.mark.slow
def test_tour_runs_top_to_bottom(executed):
    text, outputs = executed
    assert not [output for output in outputs if output.output_type == "error"]
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(images) >= 6  # data, two pairs of curves, snapshots, real vs fake, batch-mates
    assert any("text/html" in output.get("data", {}) for output in outputs)  # the animation


@pytest.mark.slow
def test_tour_prints_each_counterfactual(executed):
    text, _ = executed
    # section 1: Sigmoid + BCELoss saturates at 100 with a zero gradient (pytorch/examples#822)
    assert "Sigmoid + BCELoss:  loss_G = 100.0" in text
    # section 4: inside each step, the other network has no gradient
    assert "just before D's optimizer.step(): D 8/8 parameters have .grad, G 0/10" in text
    assert "just before G's optimizer.step(): D 0/8 parameters have .grad, G 10/10" in text
    # section 5: no detach, no freezing, the real error, and the wrong fix's polluted gradient
    assert "without detach, after D's backward: G 10/10" in text
    assert "without freezing, after G's backward: D 8/8" in text
    assert "RuntimeError: Trying to backward through the graph a second time" in text
    assert "polluted == clean + D's contribution: True" in text
    assert "with G.zero_grad() before the G step: equal to the clean gradient: True" in text
    assert number_after("cosine(D's contribution, G's own gradient) =", text) < 0
    assert number_after("cosine(polluted, G's own gradient) =", text) < 0  # "look more fake"


@pytest.mark.slow
def test_tour_measures_what_its_text_claims(executed):
    text, _ = executed
    # section 6: the D-wins run ends with D(x) near 1 and D(G(z)) near 0
    last = re.findall(r"151-200\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)", text)
    assert last, "the D-wins summary has no row for steps 151-200"
    loss_d, loss_g, d_real, d_fake = map(float, last[-1])
    assert loss_d < 0.05 and loss_g > 3 and d_real > 0.95 and d_fake < 0.05
    # section 9: train mode moves the statistics and mixes the batch; eval mode does neither
    assert number_after("sample() (eval mode): running_mean moved by", text) == 0
    assert number_after("train mode: |alone - batch A| max", text) > 0.01
    assert number_after("eval mode:  |alone - batch A| max", text) < 1e-5
    # section 10: the lessons of tests/test_lessons.py, at the tour's size
    assert "after g_step: D + 3  G + 1" in text
    assert "summed: 1 backward(s) through G" in text and "separate: 2 backward(s) through G" in text
    assert number_after("d_batchnorm=False: 4 micro-batches of 16 vs one of 64, relative difference", text) < 1e-4
    assert number_after("d_batchnorm=True : 4 micro-batches of 16 vs one of 64, relative difference", text) > 1e-2
    assert "view: RuntimeError: view size is not compatible" in text
