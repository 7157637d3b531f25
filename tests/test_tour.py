"""docs/tour.ipynb runs top to bottom and prints what its text says it shows.

The notebook is executed with nbclient in a kernel that runs this very interpreter (a kernel spec
written for the test, so a user-level `python3` kernel pointing at another Python cannot be picked
up). It needs the `docs` extra (nbclient, nbformat, ipykernel, matplotlib), which `test` pulls in.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import nbclient
import nbformat
import pytest
from ipykernel import kernelspec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from test_docs import heading_anchors

from gan.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
TOUR = ROOT / "docs" / "tour.ipynb"


def test_tour_is_stored_without_outputs_and_small():
    nb = nbformat.read(TOUR, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
    assert TOUR.stat().st_size < 100_000


def test_tour_shows_the_source_of_each_function_before_a_cell_calls_it():
    """Every name the tour imports from `gan` is passed to show_source in an earlier code cell than
    the first cell that uses it: the reader sees a function before a cell calls it."""
    nb = nbformat.read(TOUR, as_version=4)
    trees = [ast.parse(cell.source) for cell in nb.cells if cell.cell_type == "code"]
    imported = {
        alias.asname or alias.name
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gan"
        for alias in node.names
    }
    shown_at: dict[str, int] = {}
    used_at: dict[str, int] = {}
    for index, tree in enumerate(trees):
        in_show_source = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "show_source":
                for name in (n for arg in node.args for n in ast.walk(arg) if isinstance(n, ast.Name)):
                    shown_at.setdefault(name.id, index)
                    in_show_source.add(id(name))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in imported and id(node) not in in_show_source:
                used_at.setdefault(node.id, index)
    assert used_at, "the tour uses nothing it imports from gan?"
    late = {name: (shown_at.get(name), cell) for name, cell in used_at.items() if shown_at.get(name, cell) >= cell}
    assert not late, (
        f"used before (or without) show_source, as name: (shown in code cell, first used in code cell): {late}"
    )


def test_tour_links_point_at_files_and_headings_of_this_repository():
    nb = nbformat.read(TOUR, as_version=4)
    problems = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        assert "issue notes" not in cell.source.lower()
        # every relative path the text names, link or not, is a file of this repository
        for path in re.findall(r"(?:\.\./)+[\w./-]*\w", cell.source):
            named = (TOUR.parent / path).resolve()
            if ROOT not in named.parents or not named.exists():
                problems.append(f"{path} is no file of this repository")
        for match in re.finditer(r"\]\((?P<target>[^)\s]+)\)", cell.source):
            target, _, anchor = match.group("target").partition("#")
            if re.match(r"^[a-z]+:", target):
                continue
            page = (TOUR.parent / target).resolve() if target else TOUR
            if ROOT not in page.parents or not page.exists():
                problems.append(f"({match.group('target')}) is no file of this repository")
            elif anchor and page.suffix == ".md" and anchor not in heading_anchors(page.read_text(encoding="utf-8")):
                problems.append(f"({match.group('target')}): {page.name} has no heading #{anchor}")
    assert not problems


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
        timeout=300,  # per cell; the whole notebook takes a minute or two on 2 shared cores
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
    html = [output["data"]["text/html"] for output in outputs if "text/html" in output.get("data", {})]
    assert any("<script" in page for page in html)  # the animation (the source listings have no script)
    listings = [output["data"]["text/plain"] for output in outputs if output.get("data", {}).get("text/html")]
    assert any(listing.startswith("# gan/core/steps.py:d_step\ndef d_step(") for listing in listings)


@pytest.mark.slow
def test_tour_prints_each_counterfactual(executed):
    text, _ = executed
    # section 1: Sigmoid + BCELoss saturates at 100 with a zero gradient (pytorch/examples#822)
    assert "Sigmoid + BCELoss:  loss_G = 100.0" in text
    # section 4: inside each step, the other network has no gradient
    assert "just before D's optimizer.step(): D 8/8 parameters have .grad, G 0/10" in text
    assert "just before G's optimizer.step(): D 0/8 parameters have .grad, G 10/10" in text
    # section 5 (a): no detach raises at the G step, in this loop and in dcgan/main.py's order
    assert "without detach, after D's backward: G 10/10" in text
    error = "RuntimeError: Trying to backward through the graph a second time"
    assert f"this loop, at g_step: {error}" in text
    assert f"dcgan/main.py, at errG.backward(): {error}" in text
    # (b) retain_graph=True: D's contribution reaches G's update here; zero_grad() before the G step wipes it
    assert "polluted == clean + D's contribution: True" in text
    assert number_after("|polluted - clean| / |clean| =", text) > 0.1
    assert "with G.zero_grad() before the G step: equal to the clean gradient: True" in text
    assert number_after("cosine(D's contribution, G's own gradient) =", text) < 0
    # (c) a second G(z): the same pollution here, a fix only where G's gradients are cleared first
    assert "second G(z), this loop:" in text
    assert number_after("second G(z), this loop: |polluted - clean| / |clean| =", text) > 0.1
    assert re.search(r"second G\(z\), this loop: .*polluted == clean \+ D's contribution: True", text)
    assert "second G(z) after G.zero_grad(): equal to the clean gradient: True" in text
    # (d) no freezing: G's leftover reaches D's next update here; zero_grad() before the D step wipes it
    assert "without freezing, after G's backward: D 8/8" in text
    assert "polluted == clean + G's leftover: True" in text
    assert number_after("cosine(G's leftover, D's own gradient) =", text) < 0
    assert "with D.zero_grad() before the D step: equal to D's own gradient: True" in text


@pytest.mark.slow
def test_tour_measures_what_its_text_claims(executed):
    text, _ = executed
    # section 6: the D-wins run ends with D(x) near 1 and D(G(z)) near 0
    last = re.findall(r"151-200\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)", text)
    assert last, "the D-wins summary has no row for steps 151-200"
    loss_d, loss_g, d_real, d_fake = map(float, last[-1])
    assert loss_d < 0.05 and loss_g > 3 and d_real > 0.95 and d_fake < 0.05
    # section 3: the default width it names is the config's
    defaults = ModelConfig()
    assert f"at this project's defaults (width {defaults.g_width}, z_dim {defaults.z_dim})" in text
    assert defaults.g_width == defaults.d_width
    # section 9: train mode moves the statistics and mixes the batch; eval mode does neither
    assert number_after("sample() (eval mode): running_mean moved by", text) == 0
    assert number_after("train mode: |alone - batch A| max", text) > 0.01
    assert number_after("eval mode:  |alone - batch A| max", text) < 1e-5
    # section 9 (c): the EMA generator is more precise and less varied than G, in every mode
    columns = ["mean", "std", "ink", "precision", "recall", "density", "coverage"]
    rows = {}
    for network in ("G", "EMA G"):
        for mode in ("eval, stats as trained", "eval, stats recomputed", "train mode (batch 64)"):
            match = re.search(r"(?m)^" + re.escape(f"{network}, {mode}") + r"((?:\s+-?[0-9.]+){7})", text)
            assert match, f"no table row for {network}, {mode}"
            rows.setdefault(network, []).append(dict(zip(columns, map(float, match.group(1).split()))))
    assert min(row["precision"] for row in rows["EMA G"]) > max(row["precision"] for row in rows["G"])
    assert max(row["recall"] for row in rows["EMA G"]) < min(row["recall"] for row in rows["G"])
    # the EMA's averaged BatchNorm statistics are not those of its averaged weights
    assert number_after("running_mean, averaged vs recomputed for its weights: up to", text) > 0
    # section 10: the lessons of tests/test_lessons.py, at the tour's size
    assert "after g_step: D + 3  G + 1" in text
    assert "summed: 1 backward(s) through G" in text and "separate: 2 backward(s) through G" in text
    assert number_after("d_batchnorm=False: 4 micro-batches of 16 vs one of 64, relative difference", text) < 1e-4
    assert number_after("d_batchnorm=True : 4 micro-batches of 16 vs one of 64, relative difference", text) > 1e-2
    assert "view: RuntimeError: view size is not compatible" in text
