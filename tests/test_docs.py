"""The docs cite the code: every file, function, test, link, folder and excerpt they name exists as written.

Read with ast (no torch): `path.py[:name]`, `gan.module.name`, `test_x.py::test_name`, `::test_name` (the test file
cited before it in the cell or sentence), `prefix::test_name` (a page's table row | `steps::` | `tests/test_steps.py` |)
or a bare `test_name` (parametrize ids unchecked); a ```python excerpt headed `# path.py:function` (`...` abridges).
"""

from __future__ import annotations

import ast
import functools
import itertools
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)\s*(\w*)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# a .py path, optionally with `:name` or `:Class.method`; not the tail of a longer word or path
PATH = re.compile(r"(?<![\w./-])(?P<path>(?:\.\./|[\w.-]+/)*[\w-]+\.py)(?![\w/])(?::(?P<name>[A-Za-z_][\w.]*\w))?")
TEST_ID = re.compile(r"(?<![\w.])(?P<left>[\w./-]+)?::(?P<name>test_\w+)")
BARE_TEST = re.compile(r"^(?P<name>test_\w+)(?:\[[^\]]*\])?$")
DOTTED = re.compile(r"^(?P<dotted>gan(?:\.\w+)+)(?:\(\))?$")
PREFIX = re.compile(r"^(\w+)::$")
FOLDER = re.compile(r"(?<![\w./-])(?P<folder>(?:gan|tests|scripts|docs|configs)/(?:[\w.-]+/)*)(?![\w.<-])")
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
EXCERPT_HEAD = re.compile(r"^#\s*(?P<path>[\w./-]+\.py):(?P<name>[A-Za-z_][\w.]*\w)")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(\x00])")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")


# reading the code ---------------------------------------------------------------------------------


@functools.cache
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def bound_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body binds: defs, classes, assignments, imports."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update((name.id, node) for t in node.targets for name in ast.walk(t) if isinstance(name, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(((alias.asname or alias.name).split(".")[0], node) for alias in node.names)
    return names


def find_definition(path: Path, dotted: str) -> ast.AST | None:
    """The node that binds `name` or `Class.method` in the file, or None."""
    node: ast.AST = parse(path)
    for part in dotted.split("."):
        if not isinstance(node, (ast.Module, ast.ClassDef)):
            return None
        node = bound_names(node.body).get(part)
    return node


@functools.cache
def repository_files() -> tuple[Path, ...]:
    folders = ("gan", "scripts", "tests")
    return tuple(sorted([*ROOT.glob("*.py"), *(p for folder in folders for p in (ROOT / folder).rglob("*.py"))]))


def resolve_file(path: str, doc: Path) -> tuple[Path | None, str | None]:
    """(file, None), (None, None) for another project's file, or (None, the problem)."""
    if "/" in path:
        if path.startswith("../"):
            target = (doc.parent / path).resolve()
        elif (ROOT / path.split("/")[0]).exists() and not path.startswith("."):
            target = ROOT / path
        else:
            return None, None  # another project's file (dcgan/main.py of pytorch/examples)
        return (target, None) if target.is_file() else (None, f"`{path}` does not exist")
    if (ROOT / path).is_file():
        return ROOT / path, None
    matches = [p for p in repository_files() if p.name == path]
    if len(matches) == 1:
        return matches[0], None
    if not matches:
        return None, f"`{path}`: no file of that name in the repository"
    where = ", ".join(str(p.relative_to(ROOT)) for p in matches)
    return None, f"`{path}` is ambiguous ({where}): write its folder"


def resolve_module(dotted: str) -> tuple[Path | None, str]:
    """`gan.a.b.name` -> (the longest module prefix's file, the rest of the name)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate, ".".join(parts[cut:])
    return None, dotted


# reading the docs ---------------------------------------------------------------------------------


def split_fences(text: str) -> tuple[list[str], list[tuple[int, str, list[str]]]]:
    """(the prose lines, fenced blocks blanked out), and each block as (first line number, language, lines)."""
    prose: list[str] = []
    blocks: list[tuple[int, str, list[str]]] = []
    block: list[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if block is None and fence:
            block, language, start = [], fence.group(2), number + 1
        elif block is not None and fence and not fence.group(2):
            blocks.append((start, language, block))
            block = None
        elif block is not None:
            block.append(line)
        else:
            prose.append(line)
            continue
        prose.append("")
    return prose, blocks


def split_sentences(paragraph: str) -> list[str]:
    """Sentences, never splitting inside a code span."""
    spans: list[str] = []

    def hide(match: re.Match) -> str:
        spans.append(match.group(0))
        return f"\x00{len(spans) - 1}\x01"

    masked = CODE_SPAN.sub(hide, paragraph)
    restore = functools.partial(re.sub, r"\x00(\d+)\x01", lambda m: spans[int(m.group(1))])
    return [restore(sentence) for sentence in SENTENCE_END.split(masked)]


def table_cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def scopes(prose: list[str]) -> list[str]:
    """Table cells, headings and sentences: where `::test_name` or a bare `test_name` takes its file from before."""
    out: list[str] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            out.extend(split_sentences(" ".join(paragraph)))
            paragraph.clear()

    for line in prose:
        stripped = line.strip()
        if not stripped or stripped.startswith(("|", "#")) or LIST_ITEM.match(line):  # each ends a paragraph
            flush()
        if stripped.startswith("|"):
            out.extend(table_cells(line))
        elif stripped.startswith("#"):  # a heading: a scope of its own
            out.append(stripped)
        elif stripped:
            paragraph.append(stripped)
    flush()
    return out


def prefixes(prose: list[str], doc: Path) -> dict[str, Path]:
    """A page's short test prefixes: table rows | `a::`, `b::` | `tests/test_a.py`, `tests/test_b.py` |."""
    mapping: dict[str, Path] = {}
    for cells in (table_cells(line) for line in prose if line.lstrip().startswith("|")):
        if len(cells) < 2:
            continue
        names = [PREFIX.match(span) for span in CODE_SPAN.findall(cells[0])]
        files = [span for span in CODE_SPAN.findall(cells[1]) if span.endswith(".py")]
        if names and all(names) and len(names) == len(files):
            for name, file in zip(names, files):
                target, _ = resolve_file(file, doc)
                if target is not None:
                    mapping[name.group(1)] = target
    return mapping


# the checks ---------------------------------------------------------------------------------------


def check_path(path: str, name: str | None, doc: Path) -> str | None:
    target, problem = resolve_file(path, doc)
    if target is not None and name is not None and find_definition(target, name) is None:
        return f"`{path}:{name}`: {target.relative_to(ROOT)} defines no `{name}`"
    return problem


def check_test(file: Path, name: str, cited: str) -> str | None:
    if not file.name.startswith("test_"):
        return f"`{cited}`: {file.relative_to(ROOT)} is not a test file"
    return None if find_definition(file, name) else f"`{cited}`: no test `{name}` in {file.relative_to(ROOT)}"


def citation_problems(text: str, doc: Path) -> list[str]:
    """Every cited file, name and test of one page that does not exist."""
    prose, blocks = split_fences(text)
    short = prefixes(prose, doc)
    problems: list[str] = []
    for scope in scopes(prose):
        current: Path | None = None  # the test file cited last in this cell or sentence
        for span in CODE_SPAN.findall(scope):
            span = span.strip()
            for match in PATH.finditer(span):
                problems.append(check_path(match.group("path"), match.group("name"), doc))
                target, _ = resolve_file(match.group("path"), doc)
                if target is not None and target.name.startswith("test_"):
                    current = target
            for match in TEST_ID.finditer(span):
                left, name = match.group("left"), match.group("name")
                if left is None:
                    file, problem = current, f"`{span}`: `::{name}` with no test file cited before it"
                elif left.endswith(".py"):
                    file, problem = resolve_file(left, doc)
                    problem = problem or f"`{span}`: not a file of this repository"
                else:
                    file, problem = short.get(left), f"`{span}`: the page maps no file to the prefix `{left}::`"
                problems.append(check_test(file, name, span) if file is not None else problem)
            if bare := BARE_TEST.match(span):
                name = bare.group("name")
                if current is not None:
                    problems.append(check_test(current, name, span))
                elif not any(find_definition(file, name) for file in (ROOT / "tests").glob("test_*.py")):
                    problems.append(f"`{span}`: no test of that name in tests/")
            if dotted := DOTTED.match(span):
                module, rest = resolve_module(dotted.group("dotted"))
                if module is None:
                    problems.append(f"`{span}`: no such module in gan/")
                elif rest and find_definition(module, rest) is None:
                    problems.append(f"`{span}`: {module.relative_to(ROOT)} binds no `{rest}`")
    fenced = "\n".join(line for _, _, lines in blocks for line in lines)  # commands and layouts name files too
    for match in PATH.finditer(fenced):
        problems.append(check_path(match.group("path"), match.group("name"), doc))
    spans = "\n".join(CODE_SPAN.findall("\n".join(prose)))
    for match in [*FOLDER.finditer(fenced), *FOLDER.finditer(spans)]:
        if not (ROOT / match.group("folder")).is_dir():
            problems.append(f"`{match.group('folder')}` is not a folder of the repository")
    return [problem for problem in problems if problem]


def link_problems(text: str, doc: Path) -> list[str]:
    """A relative link must point into this repository; its #anchor at a heading of that page (or of this one)."""
    prose, _ = split_fences(text)
    problems = []
    for match in LINK.finditer("\n".join(prose)):
        target, _, anchor = match.group("target").partition("#")
        if re.match(r"^[a-z]+:", target):
            continue
        page = (doc.parent / target).resolve() if target else doc
        if page != ROOT and ROOT not in page.parents:
            problems.append(f"link ({match.group('target')}) leaves the repository")
        elif not page.exists():
            problems.append(f"link ({match.group('target')}) points at nothing")
        elif anchor and page.suffix == ".md" and anchor not in heading_anchors(page.read_text(encoding="utf-8")):
            problems.append(f"link ({match.group('target')}): {page.name} has no heading #{anchor}")
    return problems


def heading_anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' and '_' dropped, space '-', repeats -1, -2, ..."""
    prose, _ = split_fences(text)
    anchors: set[str] = set()
    for line in prose:
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in anchors:
            n += 1
            candidate = f"{slug}-{n}"
        anchors.add(candidate)
    return anchors


def normalise(line: str) -> str:
    return " ".join(line.split())


def excerpt_problems(text: str, doc: Path) -> list[str]:
    """Each ```python excerpt headed `# path.py:function` against the function's source, in order."""
    _, blocks = split_fences(text)
    problems = []
    for start, language, lines in blocks:
        head = EXCERPT_HEAD.match(lines[0].strip()) if language == "python" and lines else None
        if head is None:
            continue
        cited = f"{head.group('path')}:{head.group('name')}"
        target, problem = resolve_file(head.group("path"), doc)
        node = find_definition(target, head.group("name")) if target is not None else None
        if node is None:
            problems.append(f"line {start}: excerpt of `{cited}`: {problem or 'no such definition'}")
            continue
        source = target.read_text(encoding="utf-8").splitlines()[node.lineno - 1 : node.end_lineno]
        source = [normalise(line) for line in source]
        position = 0
        for offset, line in enumerate(lines[1:], start + 1):
            code = normalise(line)
            if not code or "..." in code or "…" in code:
                continue
            try:
                position = source.index(code, position) + 1
            except ValueError:
                where = "not in" if code not in source else "out of order in"
                problems.append(f"line {offset}: `{code}` is {where} {cited}")
    return problems


@pytest.mark.parametrize("check", [citation_problems, link_problems, excerpt_problems])
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_citation_link_and_excerpt_of_a_page_holds(doc, check):
    problems = check(doc.read_text(encoding="utf-8"), doc)
    assert not problems, "\n".join(problems)


# the checker itself: each kind of wrong citation is caught -----------------------------------------

PAGE = ROOT / "docs" / "page.md"

WRONG_CITATIONS = [
    "`gan/steps.py:d_step`",  # the file moved
    "`gan/core/steps.py:d_stepp`",  # no such function
    "`gan/core/models.py:Discriminator.forward_with_features`",  # no such method
    "`training.py:train`",  # a bare name that no file has any more (gan/training.py moved)
    "`gan.steps.frozen`",  # no such module
    "`gan.core.steps.thawed`",  # no such name
    "`tests/test_steps.py::test_nothing_like_this`",
    "| `test_steps.py::test_d_step_leaves_generator_gradients_none`, `::test_nothing_like_this` |",
    "| `::test_d_step_leaves_generator_gradients_none` |",  # no file before it in its cell
    "`steps::test_d_step_leaves_generator_gradients_none`",  # no prefix table on this page
    "| `walk::` | `tests/test_walkthrough.py` |\n\nSee `walk::test_d_step_leaves_generator_gradients_none`.",
    "`test_nothing_like_this`",
    "```\ngan/training.py   the loop\n```",  # a layout diagram names files too
    "```\ngan/lesson/        the lesson\n```",  # and folders
    "Under `tests/unit/`.",
]
RIGHT_CITATIONS = [
    "`gan/core/steps.py:d_step`, `gan/core/models.py:Discriminator.forward`, `models.py:Generator`",
    "`gan/core/steps.py:FP32`, `gan.core.steps.frozen`, `gan.training.train`, `dcgan/main.py`",
    "| `test_steps.py::test_d_step_leaves_generator_gradients_none`, "
    "`::test_adam_skips_parameters_whose_grad_is_none` |",
    "| `l::` | `tests/test_lessons.py` |\n\nSee `l::test_separate_mode_runs_G_backward_once_per_term[summed]`.",
    "`python scripts/bench.py --rounds 3`",
]


@pytest.mark.parametrize("text, wrong", [(t, True) for t in WRONG_CITATIONS] + [(t, False) for t in RIGHT_CITATIONS])
def test_a_wrong_citation_is_caught_and_a_right_one_passes(text, wrong):
    assert (citation_problems(text, PAGE) != []) == wrong


def test_a_wrong_excerpt_link_or_anchor_is_caught():
    for body, right in [
        ("release_grads\nfor p in module.parameters():\n    p.grad = None", True),
        ("release_grads\np.grad = None\nfor p in module.parameters():", False),  # swapped
        ("release_grads\nfor p in module.parameters():\n    p.grad.zero_()", False),  # edited
        ("d_step\npenalties = ctx.penalties\n...\nrelease_grads(D)", True),  # abridged
    ]:
        assert (excerpt_problems(f"```python\n# gan/core/steps.py:{body}\n```", PAGE) == []) == right, body
    assert link_problems("[x](../tests/test_claims.py)", PAGE) == []
    assert link_problems("[x](../tests/test_nothing.py)", PAGE) != []
    assert link_problems("[x](../../shared/notes.md)", PAGE) == ["link (../../shared/notes.md) leaves the repository"]
    assert link_problems("[x](walkthrough.md#more-lessons)", PAGE) == []
    assert link_problems("[x](walkthrough.md#no-such-section)", PAGE) != []
    text = "# A title\n## 3. (1) D step: `detach()`, `grad = None`\n## Notes\n## Notes\n"
    assert heading_anchors(text) == {"a-title", "3-1-d-step-detach-grad--none", "notes", "notes-1"}


# one voice per technique: the key sentences -------------------------------------------------------
# docs/walkthrough.md explains each technique once. Where another page states the same fact (the
# README's technique table, the tour, claims.md), it repeats these sentences word for word, so they
# cannot drift apart; and no page may keep a phrasing they replaced.

KEY_STATEMENTS = {
    "detach": (
        "Without `detach()` in the D step, D's `backward()` runs on through G's graph and frees it. In "
        "this loop, whose G step backpropagates through the same `fake`, the G step's `backward()` then "
        'raises "Trying to backward through the graph a second time"; a G step that made a second `G(z)` '
        "would raise nothing, and D's loss would reach G's update silently."
    ),
    "retain_graph": (
        "`retain_graph=True` is needed where one graph is backpropagated more than once: here, "
        "`loss.backward_mode=separate`, one `backward()` per G term. Adding it to a D step that forgot "
        "`detach()` silences the error but lets D's loss write into G's `.grad`, and in this loop, which "
        "clears gradients after each update rather than before each backward, that gradient reaches G's "
        "next update."
    ),
    "clearing": (
        "This loop clears gradients right after each update (`param.grad = None`), not before each "
        "backward as `dcgan/main.py`'s `zero_grad()` calls do: no gradient outlives its step, so a test "
        "can check that a network holds none between steps. The price is that a gradient written between "
        "one update and the next is still there at the next update, which is why D is frozen in the G "
        "step. `dcgan/main.py` trains correctly without freezing D, because its `netD.zero_grad()` wipes "
        "what the G step wrote into D's `.grad`."
    ),
    "grad_none": (
        "Setting `.grad` to `None` rather than zero frees the gradient's memory while the other network "
        "trains, and the next `backward()` writes a fresh gradient instead of adding to zeros. An "
        "optimizer skips a parameter whose `.grad` is `None`, while a zero `.grad` is still stepped: "
        "with Adam's beta1 above 0 (`experiment=paper`'s 0.5) that moves the parameter by momentum; with "
        "the default beta1 = 0 it does not."
    ),
    "eval_sampling": (
        "`sample` draws with G in `eval()` mode under `no_grad()`: BatchNorm normalises with its running "
        "statistics and leaves them unchanged, and no graph is built. The samples drawn during training come "
        "from the EMA generator, whose running statistics are averages of G's over training and do not match "
        "the averaged weights; `evaluate.py` recomputes them for the averaged weights before it measures."
    ),
}

# Other pages that repeat a key sentence: claims.md states claims 54 and 62 with them.
REPEATED_IN = {ROOT / "docs" / "claims.md": ("detach", "retain_graph", "grad_none")}

# Phrasings the key sentences replaced, each wrong (see the walkthrough, sections 3, 4 and 7):
WRONG_PHRASINGS = (
    "needed only by a D step that forgets",  # loss.backward_mode=separate needs retain_graph too
    "Only a GAN step that forgets",  # the same, in claims.md's words
    "a stale gradient can never leak",  # not a property of None over zero: after-update clearing lets one leak
    "more varied",  # the tour measures a lower recall for the EMA generator than for G
    "the next `zero_grad()` hides it",  # without detach() the G step raises: nothing is hidden
    "a missing detach costs a backward through G and nothing worse",  # it raises first
    "or a second `G(z)` for the G step",  # offered as a fix: in this loop D's gradient still reaches G
    "five short files",  # gan/core/ has six
    "nothing leaks silently",  # only while the G step reuses `fake`: a second G(z) leaks in silence
    "which this loop needs because it clears",  # circular: the reason for param.grad = None is not itself
    "instead of moving it by momentum on a zero gradient",  # not with the default beta1 = 0
    "the signature of a collapse",  # D winning is not mode collapse, which has no loss signature
    "D is sure of every real",  # r_t counts the signs of D's logits, not how sure D is
    "the share of real images D scores as real, averaged",  # r_t is that share less the share scored fake
    "so that Adam skips a parameter without a gradient",  # no parameter of this loop lacks one at its update
    "random draws come from torch's generator",  # the default adaptive augmentation draws from its own
)


def readme_technique_rows(text: str) -> list[list[str]]:
    """The body rows of the README's table headed | technique | where | proven by ... | read |."""
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if table_cells(line)[:2] == ["technique", "where"]]
    assert heads, "README.md has no technique table"
    body = itertools.takewhile(lambda line: line.lstrip().startswith("|"), lines[heads[0] + 2 :])
    return [table_cells(line) for line in body]


def as_prose(cell: str) -> str:
    """A table cell read as prose: <br> a space, no bold markers or escaped pipes, whitespace collapsed."""
    return normalise(re.sub(r"<br\s*/?>", " ", cell).replace("**", "").replace("\\|", "|"))


@pytest.mark.parametrize(
    "page, key",
    [(ROOT / "docs" / "walkthrough.md", key) for key in KEY_STATEMENTS]
    + [(page, key) for page, keys in REPEATED_IN.items() for key in keys],
)
def test_each_key_statement_stands_word_for_word_in_the_walkthrough_and_each_page_that_repeats_it(page, key):
    assert normalise(KEY_STATEMENTS[key]) in normalise(page.read_text(encoding="utf-8")), page.name


def test_no_page_keeps_a_phrasing_the_key_statements_replaced():
    """Scanned: README.md, docs/*.md, gan/**/*.py (a comment's lines joined) and the tour's cells."""
    texts = {doc: doc.read_text(encoding="utf-8") for doc in DOCS}
    for path in sorted((ROOT / "gan").rglob("*.py")):
        texts[path] = re.sub(r"\n\s*#\s*", " ", path.read_text(encoding="utf-8"))
    tour = ROOT / "docs" / "tour.ipynb"
    cells = json.loads(tour.read_text(encoding="utf-8"))["cells"]
    texts[tour] = "\n\n".join("".join(cell["source"]) for cell in cells)
    found = [
        f"{path.relative_to(ROOT)}: {phrase!r}"
        for path, text in texts.items()
        for phrase in WRONG_PHRASINGS
        if normalise(phrase).casefold() in normalise(text).casefold()
    ]
    assert not found, "\n".join(found)


def test_the_readme_technique_table_states_retain_graph_as_the_walkthrough_does():
    rows = [row for row in readme_technique_rows(README.read_text(encoding="utf-8")) if "retain_graph" in row[0]]
    wanted = normalise(KEY_STATEMENTS["retain_graph"]).rstrip(".")
    assert any(wanted in as_prose(" ".join(row)) for row in rows), (
        "no row of the README's technique table about retain_graph states:\n" + KEY_STATEMENTS["retain_graph"]
    )
    # the checks read across line breaks and table cells
    wrapped = KEY_STATEMENTS["grad_none"].replace(" the ", "\nthe ")
    assert normalise(KEY_STATEMENTS["grad_none"]) in normalise(wrapped)
    cell = "| `retain_graph` | " + KEY_STATEMENTS["retain_graph"].replace(". ", ".<br>**") + " | x |"
    assert normalise(KEY_STATEMENTS["retain_graph"]).rstrip(".") in as_prose(" ".join(table_cells(cell)))


# the proofs: docs/proofs.md and the README's technique table follow tests/test_mutations.py ---------
# MUTATIONS lists each technique removed from a copy of the code and the tests that must fail there;
# test_mutations.py imports no torch, and tests/ is on the path (as for conftest).


def cited_tests(cell: str) -> set[str]:
    """The tests a table cell cites, as `tests/test_x.py::test_name` (`::test_name`: in the file cited before)."""
    found, current = set(), None
    for span in CODE_SPAN.findall(cell):
        for match in TEST_ID.finditer(span):
            left = match.group("left")
            if left is not None and left.endswith(".py"):
                current = f"tests/{Path(left).name}"
            if current is not None:
                found.add(f"{current}::{match.group('name')}")
    return found


def proof_citation_problems(readme: str) -> list[str]:
    """One README technique row per MUTATIONS technique, citing each of its tests, and no PyTorch fact as a proof."""
    from test_mutations import MUTATIONS, pytorch_facts

    rows = readme_technique_rows(readme)
    problems = []
    for mutation in MUTATIONS:
        matching = [row for row in rows if mutation.readme in row[0]]
        if len(matching) != 1:
            problems.append(f"{mutation.id}: {len(matching)} rows' techniques contain {mutation.readme!r}, not 1")
            continue
        for node in sorted(set(mutation.cited) - cited_tests(matching[0][2])):
            problems.append(f"{mutation.id}: the row does not cite {node}")
    facts = pytorch_facts()
    for row in rows:
        for node in sorted(cited_tests(row[2]) & facts):
            problems.append(f"{row[0][:60]}: cites {node}, a PyTorch fact, as a proof")
    return problems


def test_the_proofs_page_is_generated_and_the_readme_cites_each_proof_and_states_what_make_test_runs():
    from test_mutations import MUTATIONS, PROOFS_PAGE, VARIANTS, proofs_page

    assert PROOFS_PAGE.read_text(encoding="utf-8") == proofs_page(), (
        "docs/proofs.md differs from MUTATIONS: run `.venv/bin/python tests/test_mutations.py --write`"
    )
    problems = proof_citation_problems(README.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)
    readme, kinds = normalise(README.read_text(encoding="utf-8")), sum(1 for m in MUTATIONS if m.kind)
    assert (
        f"`make test` runs the {len(MUTATIONS)} mutants of `tests/test_mutations.py`, each on a copy of the code: "
        f"{len(MUTATIONS) - kinds} remove a technique one way, and {kinds} break what surrounds one" in readme
    )
    assert f"{len(VARIANTS)} more ways run by hand (`--variants`" in readme
    # make test is the tier not marked slow, and nothing in test_mutations.py is marked slow
    assert '-m "not slow"' in (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "mark.slow" not in (ROOT / "tests" / "test_mutations.py").read_text(encoding="utf-8")


def test_a_readme_citing_a_fact_or_missing_a_proof_is_caught():
    readme = README.read_text(encoding="utf-8")
    proof, fact = "::test_d_step_leaves_generator_gradients_none", "::test_without_detach_d_loss_reaches_generator"
    assert proof in readme
    assert any("test_d_step_leaves" in p for p in proof_citation_problems(readme.replace(proof, fact)))
    assert any("a PyTorch fact" in p for p in proof_citation_problems(readme.replace(proof, f"{proof}`, `{fact}")))
    cell = "`test_a.py::test_x`, `::test_y`, `test_b.py::test_z`"
    assert cited_tests(cell) == {"tests/test_a.py::test_x", "tests/test_a.py::test_y", "tests/test_b.py::test_z"}


# README's numbers: each is recorded from the file that holds it (scripts/measured.py) ----------------


def test_readme_states_each_measurement_as_its_file_holds_it():
    from scripts import measured

    entries = measured.load()
    assert {entry["kind"] for entry in entries.values()} == {"run", "tests", "minute"}
    text = README.read_text(encoding="utf-8")
    stated, missing = normalise(text), []
    for name, entry in entries.items():
        if entry["prose"]:
            missing += [f"{name}: {p!r}" for p in measured.phrases(entry) if p not in stated]
    assert not missing, "README.md does not state, as docs/results/measured.json holds them:\n" + "\n".join(missing)
    assert measured.table(entries) in text
    assert len(text.splitlines()) <= 150  # the README is a front door


def test_measured_reads_a_run_and_a_test_log(tmp_path):
    from scripts import measured

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "train.log").write_text(
        "[2026-11-27 02:33:00,250][train][INFO] - Output folder: run\n"
        "[2026-11-27 02:35:10,750][gan.training.monitor][INFO] - step 500  loss/d=1.3\n"
        "[2026-11-27 02:37:01,000][train][INFO] - Done: 600 steps; outputs in run. Last: run/checkpoints/last.pt\n"
    )
    scores = {"fid": 1.23456, "precision": 0.5, "recall": 0.875, "classes_covered": 9, "num_samples": 100}
    (run / "eval" / "metrics.json").write_text(json.dumps(scores))
    entry = measured.from_run(run)
    assert (entry["steps"], entry["seconds"], entry["fid"], entry["classes"]) == (600, 240.8, 1.2346, 9)
    entry.update(quiet=False, cores=2, cpu={"model": "Some CPU", "fast_bf16": False}, title="a run", command="c")
    row = "| a run | `c` | 600 | not timed (shared machine) | 1.23 | 0.50 | 0.88 | 9 / 10 |"
    assert row in measured.table({"r": entry})
    assert measured.phrases(entry) == [
        "600 steps", "FID 1.23", "precision 0.50", "recall 0.88", "9 of 10 classes",
        "on 2 busy cores of an Some CPU without fast bf16",
    ]  # fmt: skip
    log = tmp_path / "pytest.log"
    log.write_text("....\n790 passed, 23 skipped, 29 deselected, 1 warning in 113.20s (0:01:53)\n")
    assert measured.from_tests(log) == {
        "kind": "tests", "passed": 790, "skipped": 23, "deselected": 29, "warning": 1, "seconds": 113.2,
    }  # fmt: skip
    minute = tmp_path / "minute.log"
    minute.write_text("...\none_minute steps=2208 seconds=60.0 fid=2.76 classes=10 recall=0.840\n")
    entry = {**measured.from_minute(minute), "quiet": True, "cores": 2, "cpu": {"model": "X", "fast_bf16": True}}
    assert measured.phrases(entry)[0] == "2,208 steps in 1 min 0 s, FID 2.76"
    held = measured.cpu(limited_to="AVX2")  # this CPU standing in for one without AVX-512 or fast bf16
    assert held["limited_to"] == "AVX2" and held["fast_bf16"] is False
    assert measured.phrases({**entry, "cpu": held})[1].endswith(f"quiet cores of an {held['model']} held to AVX2")
    (run / "train.log").write_text("[2026-11-27 02:33:00,250][train][INFO] - step 1\n")  # stopped before the end
    with pytest.raises(SystemExit, match="did not finish"):
        measured.from_run(run)
