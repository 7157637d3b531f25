"""docs/tour.ipynb runs top to bottom (nbclient, a kernel on this interpreter) and prints what its text says."""

import ast
import importlib
import inspect
import os
import re
from pathlib import Path

import nbclient
import nbformat
import pytest
from ipykernel import kernelspec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from test_docs import link_problems

ROOT = Path(__file__).resolve().parents[1]
TOUR = ROOT / "docs" / "tour.ipynb"


# Each term, by the text that defines it: no cell before the defining one may use the term.
TERMS = {
    r"\blogits?\b": r"returns a \*\*logit\*\*",
    r"\bEMA\b": r"exponential moving average",
    r"spectral norm": r"largest singular value",
    r"\br_t\b|\$r_t\$": r"E\[sign\(D\(x\)\)\]",
    r"\bADA\b": r"ADA \(Karras et al\. 2020\)",
    r"\bFID\b": r"Fréchet distance",
    r"\brecall\b": r"recall \(the share of real images some sample\s+comes near\)",
    r"\bTTUR\b": r"two time-scale update rule",
    r"channels_last": r"NHWC",
    r"\bPacGAN\b|\bkimg\b": r"(?!)",  # not used by the tour at all
}


def test_tour_is_stored_small_its_links_next_cells_and_terms_hold_and_it_shows_each_source_before_its_use():
    nb = nbformat.read(TOUR, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
    assert TOUR.stat().st_size < 100_000
    problems = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            assert "issue notes" not in cell.source.lower()
            problems += link_problems(cell.source, TOUR)
            # every relative path the text names, link or not, is a file of this repository
            for path in re.findall(r"(?:\.\./)+[\w./-]*\w", cell.source):
                named = (TOUR.parent / path).resolve()
                if ROOT not in named.parents or not named.exists():
                    problems.append(f"{path} is no file of this repository")
    cells = nb.cells
    wrong = [i for i, cell in enumerate(cells[:-1]) if "next cell" in cell.source and cells[i + 1].cell_type != "code"]
    assert not wrong, f"cells {wrong} say 'the next cell' above a cell that is not code"
    for term, definition in TERMS.items():  # no cell before the defining one may use the term
        uses = [i for i, cell in enumerate(cells) if re.search(term, cell.source)]
        defined = [i for i, cell in enumerate(cells) if re.search(definition, cell.source)]
        if uses and (not defined or uses[0] < defined[0]):
            problems.append(f"{term}: first used in cell {uses[0]}, defined in cell {defined[:1] or 'none'}")
    assert not problems
    # each name imported from `gan` is shown (show_source) before a cell uses it; section 2's first-step cell aside
    first_step = [i for i, cell in enumerate(code) if "first-step" in cell.metadata.get("tags", [])]
    assert len(first_step) == 1, "the tour has no (or more than one) cell tagged first-step"
    imported = set(gan_imports())
    shown_at, used_at, step_uses = {}, {}, set()  # name -> code cell first shown in, first used in; the step's uses
    for index, tree in enumerate(ast.parse(cell.source) for cell in code):
        calls = [node for node in ast.walk(tree) if getattr(getattr(node, "func", None), "id", "") == "show_source"]
        shown = {id(n): n.id for call in calls for arg in call.args for n in ast.walk(arg) if isinstance(n, ast.Name)}
        for name in shown.values():
            shown_at.setdefault(name, index)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in imported and id(node) not in shown:
                if index == first_step[0]:
                    step_uses.add(node.id)
                else:
                    used_at.setdefault(node.id, index)
    assert used_at, "the tour uses nothing it imports from gan?"
    late = {name: (shown_at.get(name), cell) for name, cell in used_at.items() if shown_at.get(name, cell) >= cell}
    assert not late, f"used before (or without) show_source, as name: (shown in, first used in code cell): {late}"
    assert step_uses and step_uses <= set(shown_at), f"the first step uses, never shown: {step_uses - set(shown_at)}"


def gan_imports() -> dict[str, object]:
    """Each name the tour's code imports from `gan`, as the object it names."""
    return {
        alias.asname or alias.name: getattr(importlib.import_module(node.module), alias.name)
        for cell in nbformat.read(TOUR, as_version=4).cells
        if cell.cell_type == "code"
        for node in ast.walk(ast.parse(cell.source))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gan"
        for alias in node.names
    }


def number_after(label: str, text: str) -> float:
    match = re.search(re.escape(label) + r"\s*([-+0-9.e]+)", text)
    assert match, f"the notebook printed no {label!r}"
    return float(match.group(1))


@pytest.mark.slow
def test_tour_runs_top_to_bottom_and_prints_what_its_text_claims(tmp_path):
    kernels = tmp_path / "kernels"  # a python3 kernel on sys.executable, gan importable
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    kernelspec.write_kernel_spec(kernels / "python3", overrides={"env": {"PYTHONPATH": path}})
    specs = KernelSpecManager(kernel_dirs=[str(kernels)], ensure_native_kernel=False)
    km, nb = KernelManager(kernel_name="python3", kernel_spec_manager=specs), nbformat.read(TOUR, as_version=4)
    docs = {"metadata": {"path": str(ROOT / "docs")}}
    client = nbclient.NotebookClient(nb, km=km, timeout=300, resources=docs)  # timeout per cell
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    outputs = [output for cell in nb.cells if cell.cell_type == "code" for output in cell.outputs]
    text = "".join(output.get("text", "") for output in outputs if output.output_type == "stream")  # all printed
    assert not [output for output in outputs if output.output_type == "error"]
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(images) >= 6  # data, two pairs of curves, snapshots, real vs fake, batch-mates
    html = [output["data"]["text/html"] for output in outputs if "text/html" in output.get("data", {})]
    assert any("<script" in page for page in html)  # the animation (the source listings have no script)
    listings = [output["data"]["text/plain"] for output in outputs if output.get("data", {}).get("text/html")]
    assert any(listing.startswith("# gan/core/steps.py:d_step\ndef d_step(") for listing in listings)
    # section 1: Sigmoid + BCELoss saturates at 100 with a zero gradient (pytorch/examples#822)
    assert "Sigmoid + BCELoss:  loss_G = 100.0" in text
    # section 4: inside each step, the other network has no gradient
    assert "just before D's optimizer.step(): D 8/8 parameters have .grad, G 0/10" in text
    assert "just before G's optimizer.step(): D 0/8 parameters have .grad, G 10/10" in text
    # section 5 (a): no detach raises at the G step, in this loop and in dcgan/main.py's order
    assert "without detach, after D's backward: G 10/10" in text
    error = "RuntimeError: Trying to backward through the graph a second time"
    assert f"this loop, at g_step: {error}" in text and f"dcgan/main.py, at errG.backward(): {error}" in text
    # (b) retain_graph=True: D's contribution reaches G's update here; zero_grad() before the G step wipes it
    assert "polluted == clean + D's contribution: True" in text
    assert number_after("|polluted - clean| / |clean| =", text) > 0.1
    assert "with G.zero_grad() before the G step: equal to the clean gradient: True" in text
    assert number_after("cosine(D's contribution, G's own gradient) =", text) < 0
    # (c) a second G(z): the same pollution here, a fix only where G's gradients are cleared first
    assert number_after("second G(z), this loop: |polluted - clean| / |clean| =", text) > 0.1
    assert re.search(r"second G\(z\), this loop: .*polluted == clean \+ D's contribution: True", text)
    assert "second G(z) after G.zero_grad(): equal to the clean gradient: True" in text
    # (d) no freezing: G's leftover reaches D's next update here; zero_grad() before the D step wipes it
    assert "without freezing, after G's backward: D 8/8" in text and "polluted == clean + G's leftover: True" in text
    assert number_after("cosine(G's leftover, D's own gradient) =", text) < 0
    assert "with D.zero_grad() before the D step: equal to D's own gradient: True" in text
    # section 6: the D-wins run ends with D(x) near 1 and D(G(z)) near 0
    last = re.findall(r"151-200\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)", text)
    assert last, "the D-wins summary has no row for steps 151-200"
    loss_d, loss_g, d_real, d_fake = map(float, last[-1])
    assert loss_d < 0.05 and loss_g > 3 and d_real > 0.95 and d_fake < 0.05
    # section 7: D pulls ahead early (#822's shape), then G catches up
    rows = re.findall(r"(?m)^\s*(\d+)-(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$", text)
    run = [tuple(map(float, row[2:])) for row in rows if int(row[1]) - int(row[0]) == 99]  # the 600-step run
    assert len(run) == 6, run
    fakes, losses_g = [row[3] for row in run], [row[1] for row in run]
    assert fakes.index(min(fakes)) <= 2 and losses_g.index(max(losses_g)) <= 2 and fakes[-1] > min(fakes)
    # section 9: train mode moves the statistics and mixes the batch; eval mode does neither
    assert number_after("sample() (eval mode): running_mean moved by", text) == 0
    assert number_after("train mode: |alone - batch A| max", text) > 0.01
    assert number_after("eval mode:  |alone - batch A| max", text) < 1e-5
    # section 9 (c): the EMA generator is more precise and less varied than G, in every mode
    columns, rows = ["mean", "std", "ink", "precision", "recall", "density", "coverage"], {}
    for network in ("G", "EMA G"):
        for mode in ("eval, stats as trained", "eval, stats recomputed", "train mode (batch 64)"):
            match = re.search(r"(?m)^" + re.escape(f"{network}, {mode}") + r"((?:\s+-?[0-9.]+){7})", text)
            assert match, f"no table row for {network}, {mode}"
            rows.setdefault(network, []).append(dict(zip(columns, map(float, match.group(1).split()))))
    verdicts = {"precision": "higher", "density": "higher", "recall": "lower", "coverage": "higher"}
    for column, verdict in verdicts.items():
        assert f"EMA G against G, {column}: {verdict} in every row" in text  # as section 10's prose reads them
        ema, raw = [row[column] for row in rows["EMA G"]], [row[column] for row in rows["G"]]
        assert min(ema) > max(raw) if verdict == "higher" else max(ema) < min(raw)
    # train mode matches eval mode with recomputed statistics within the yardstick, for both generators
    yardstick = number_after("differs from itself by up to", text)
    for network in ("G", "EMA G"):
        assert number_after(f"{network}: train mode vs eval with stats recomputed: up to", text) < yardstick
    # the EMA's averaged BatchNorm statistics are not those of its averaged weights
    assert number_after("running_mean, averaged vs recomputed for its weights: up to", text) > 0
    # section 10: the lessons of tests/test_lessons.py, at the tour's size
    assert "after g_step: D + 3  G + 1" in text
    assert "summed: 1 backward(s) through G" in text and "separate: 2 backward(s) through G" in text
    assert number_after("d_batchnorm=False: 4 micro-batches of 16 vs one of 64, relative difference", text) < 1e-4
    assert number_after("d_batchnorm=True : 4 micro-batches of 16 vs one of 64, relative difference", text) > 1e-2
    assert "view: RuntimeError: view size is not compatible" in text


def test_the_command_line_run_of_section_7_trains_what_the_tour_trains():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from gan.config import validate

    nb = nbformat.read(TOUR, as_version=4)
    text = "\n".join(cell.source for cell in nb.cells)
    command = re.search(r"`python train\.py ([^`]+)`; `train\.py`'s own defaults", text, re.S)
    assert command, "section 7 gives no command line for its run"
    overrides = [o.strip("'") for o in command.group(1).split()]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = validate(compose(config_name="train", overrides=overrides))
    step = next(cell.source for cell in nb.cells if "first-step" in cell.metadata.get("tags", []))
    sizes = dict(zip(("IMAGE_SIZE", "Z_DIM", "WIDTH", "BATCH"), map(int, re.findall(r"\d+", step.splitlines()[0]))))
    loop = next(cell.source for cell in nb.cells if cell.source.startswith("STEPS, SNAPSHOTS = 600"))
    for literal in ("lr_g=2e-4, lr_d=2e-4", "betas=(0.5, 0.999)", "ema_decay=0.99", "BatchStream(train_images"):
        assert literal in loop  # the settings compared below are the loop's
    assert "render_digits(8192, IMAGE_SIZE" in step
    assert (cfg.data.image_size, cfg.model.z_dim, cfg.model.g_width, cfg.data.batch_size) == tuple(sizes.values())
    assert cfg.model.d_width == sizes["WIDTH"] and cfg.data.num_samples == 8192
    assert cfg.model.d_batchnorm and not cfg.model.spectral_norm and list(cfg.model.diffaugment) == []
    assert cfg.optim.lr == 2e-4 and cfg.optim.lr_d is None and (cfg.optim.beta1, cfg.optim.beta2) == (0.5, 0.999)
    assert cfg.model.ema_decay == 0.99 and cfg.model.ema_kimg == 0 and cfg.trainer.precision.value == "fp32"
    assert cfg.loss.name.value == "bce" and cfg.loss.feature_matching == 0 and cfg.trainer.max_steps == 600


def lines_read_until(last) -> int:
    """README down to its link to the tour, then the tour's cells and listings down to the first where `last` holds."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    lines, names = next(i for i, line in enumerate(readme) if "(docs/tour.ipynb)" in line) + 1, gan_imports()
    for cell in nbformat.read(TOUR, as_version=4).cells:
        lines += len(cell.source.splitlines())
        if last(cell):
            return lines
        for call in re.findall(r"(?m)^show_source\(([^)]*)\)", cell.source):
            for name in call.split(","):
                obj = names[name.strip().split(".")[0]]
                for attribute in name.strip().split(".")[1:]:
                    obj = getattr(obj, attribute)
                lines += len(inspect.getsource(inspect.unwrap(obj)).splitlines())
    raise AssertionError("no cell ends the route")


ABRIDGED = "# gan/core/steps.py:d_step (abridged)"
MERMAID = re.compile(r"```mermaid\n.*?```", re.S)


def test_a_learner_meets_a_full_step_within_about_150_lines_abridged_within_250_and_whole_later():
    """Section 2 shows the walkthrough's diagram and the steps abridged (at most 40 lines); section 5 whole."""
    from test_docs import excerpt_problems

    lines = lines_read_until(lambda cell: "first-step" in cell.metadata.get("tags", []))
    assert 100 < lines <= 150, lines  # more than 100: the count is real, README's top and the tour's first sections
    assert lines_read_until(lambda cell: ABRIDGED in cell.source) <= 250
    nb = nbformat.read(TOUR, as_version=4)
    index = next(i for i, cell in enumerate(nb.cells) if ABRIDGED in cell.source)
    cell = nb.cells[index].source
    assert excerpt_problems(cell, TOUR) == []
    code = [line for block in re.findall(r"```python\n(.*?)```", cell, re.S) for line in block.splitlines()]
    assert 20 < len(code) <= 40, len(code)
    walkthrough = (ROOT / "docs" / "walkthrough.md").read_text(encoding="utf-8")
    assert MERMAID.findall(cell) == MERMAID.findall(walkthrough) != []
    whole = [i for i, c in enumerate(nb.cells) if c.source.startswith("show_source(d_step, g_step")]
    assert whole and whole[0] > index


# Each place a page names a section of the tour, and what that section's cells hold for the name to be right.
TOUR_REFERENCES = {
    ("docs/walkthrough.md", 2): ["d_stats, real_features = d_step(D, opt_d, real, fake)", "```mermaid"],
    ("docs/walkthrough.md", 6): ["without detach, after D's backward", "second G(z), this loop"],
    ("docs/walkthrough.md", 10): ["stats recomputed"],
    ("docs/walkthrough.md", 11): ["backward(s) through G", "saved_bytes"],
    ("docs/more.md", 11): ["D(x) alone", "micro-batches of"],
}
SECTION_NAMED = re.compile(r"tour(?:'s| \(|\)?,)\s*section (\d+)|section (\d+) of the tour")


def test_every_tour_section_a_page_names_holds_what_the_page_says():
    sections, number = {}, 0
    for cell in nbformat.read(TOUR, as_version=4).cells:
        heading = re.match(r"## (\d+)\. ", cell.source) if cell.cell_type == "markdown" else None
        number = int(heading[1]) if heading else number
        sections[number] = sections.get(number, "") + cell.source
    pages = ["README.md", *(f"docs/{page.name}" for page in sorted((ROOT / "docs").glob("*.md")))]
    texts = {page: " ".join((ROOT / page).read_text(encoding="utf-8").split()) for page in pages}
    named = {(page, int(a or b)) for page, text in texts.items() for a, b in SECTION_NAMED.findall(text)}
    assert named == set(TOUR_REFERENCES), "a page names a tour section this table does not check, or no longer does"
    wrong = [(page, n, marker) for (page, n), markers in TOUR_REFERENCES.items() for marker in markers
             if marker not in sections[n]]  # fmt: skip
    assert not wrong, wrong
