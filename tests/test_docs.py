"""The docs cite the code: every file, function, test and excerpt they name must exist as written.

Checked in README.md and docs/*.md, reading the code with ast (nothing is imported, no torch):

- a backticked `path.py`, `path.py:function` or `path.py:Class.method` whose first folder is one
  of this repository's must exist, and the name must be defined in it (def, class, assignment or
  import). A bare file name (`steps.py:d_step`) must name exactly one file of the repository;
  another project's file is written with its own folder (`dcgan/main.py`), which is not checked;
- a backticked `gan.module.name` must name a module of gan/ and a name bound in it;
- a cited test must be a test function of the file it names: `test_x.py::test_name` (a bare
  `test_x.py` is looked up in tests/); `::test_name` after a cited test file in the same table cell
  or sentence; `prefix::test_name` with a prefix a page maps to a file in a table row
  (docs/walkthrough.md: | `techniques::` | `tests/test_techniques.py` |); a bare `test_name`, in the
  test file cited before it in the same cell or sentence, else in any test file. A parametrize id
  (`[True]`) is not checked;
- a relative link must point at a file or folder that exists;
- a ```python block whose first line is `# path.py:function ...` is an excerpt of that function:
  every other line, comments included, must be a line of the function, in the function's order;
  blank lines and lines with `...` (the visible abridgement, which may carry a note) aside;
- a backticked or fenced `gan/folder/` (also tests/, scripts/, docs/, configs/) must be a folder.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCE_DIRS = ("gan", "scripts", "tests")

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
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
    return names


def find_definition(path: Path, dotted: str) -> ast.AST | None:
    """The node that binds `name` or `Class.method` in the file, or None."""
    body: list[ast.stmt] = parse(path).body
    node: ast.AST | None = None
    for part in dotted.split("."):
        if node is not None:
            if not isinstance(node, ast.ClassDef):
                return None
            body = node.body
        node = bound_names(body).get(part)
        if node is None:
            return None
    return node


@functools.cache
def repository_files() -> tuple[Path, ...]:
    files = [p for p in ROOT.glob("*.py")]
    for folder in SOURCE_DIRS:
        files += (ROOT / folder).rglob("*.py")
    return tuple(sorted(files))


def top_level_entries() -> set[str]:
    return {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}


def resolve_file(path: str, doc: Path) -> tuple[Path | None, str | None]:
    """(file, None), (None, None) for another project's file, or (None, the problem)."""
    if path.startswith("../"):
        target = (doc.parent / path).resolve()
        return (target, None) if target.is_file() else (None, f"`{path}` does not exist")
    if "/" in path:
        if path.split("/")[0] not in top_level_entries():
            return None, None  # another project's file (dcgan/main.py of pytorch/examples)
        target = ROOT / path
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
    """Table cells and the sentences of paragraphs and list items: where a short citation
    (`::test_name`, a bare `test_name`) takes its file from an earlier citation."""
    out: list[str] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            out.extend(split_sentences(" ".join(paragraph)))
            paragraph.clear()

    for line in prose:
        if line.lstrip().startswith("|"):
            flush()
            out.extend(table_cells(line))
        elif not line.strip():
            flush()
        elif line.lstrip().startswith("#"):  # a heading: a scope of its own
            flush()
            out.append(line.strip())
        else:
            if LIST_ITEM.match(line):
                flush()
            paragraph.append(line.strip())
    flush()
    return out


def prefixes(prose: list[str], doc: Path) -> dict[str, Path]:
    """A page's short test prefixes: table rows | `a::`, `b::` | `tests/test_a.py`, `tests/test_b.py` |."""
    mapping: dict[str, Path] = {}
    for line in prose:
        if not line.lstrip().startswith("|"):
            continue
        cells = table_cells(line)
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
    if problem or target is None or name is None:
        return problem
    if find_definition(target, name) is None:
        return f"`{path}:{name}`: {target.relative_to(ROOT)} defines no `{name}`"
    return None


def check_folder(folder: str) -> str | None:
    return None if (ROOT / folder).is_dir() else f"`{folder}` is not a folder of the repository"


def check_test(file: Path, name: str, cited: str) -> str | None:
    if not file.name.startswith("test_"):
        return f"`{cited}`: {file.relative_to(ROOT)} is not a test file"
    if find_definition(file, name) is None:
        return f"`{cited}`: no test `{name}` in {file.relative_to(ROOT)}"
    return None


def all_test_files() -> list[Path]:
    return sorted((ROOT / "tests").glob("test_*.py"))


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
                    if current is None:
                        problems.append(f"`{span}`: `::{name}` with no test file cited before it")
                        continue
                    problems.append(check_test(current, name, span))
                elif left.endswith(".py"):
                    target, problem = resolve_file(left, doc)
                    if target is None:
                        problems.append(problem or f"`{span}`: not a file of this repository")
                        continue
                    problems.append(check_test(target, name, span))
                elif left in short:
                    problems.append(check_test(short[left], name, span))
                else:
                    problems.append(f"`{span}`: the page maps no file to the prefix `{left}::`")
            bare = BARE_TEST.match(span)
            if bare:
                name = bare.group("name")
                if current is not None:
                    problems.append(check_test(current, name, span))
                elif not any(find_definition(file, name) for file in all_test_files()):
                    problems.append(f"`{span}`: no test of that name in tests/")
            dotted = DOTTED.match(span)
            if dotted:
                module, rest = resolve_module(dotted.group("dotted"))
                if module is None:
                    problems.append(f"`{span}`: no such module in gan/")
                elif rest and find_definition(module, rest) is None:
                    problems.append(f"`{span}`: {module.relative_to(ROOT)} binds no `{rest}`")
    for _, _, lines in blocks:  # commands and layout diagrams name files too
        for line in lines:
            for match in PATH.finditer(line):
                problems.append(check_path(match.group("path"), match.group("name"), doc))
    for match in FOLDER.finditer("\n".join(line for _, _, lines in blocks for line in lines)):
        problems.append(check_folder(match.group("folder")))
    for span in CODE_SPAN.findall("\n".join(prose)):
        for match in FOLDER.finditer(span):
            problems.append(check_folder(match.group("folder")))
    return [problem for problem in problems if problem]


def link_problems(text: str, doc: Path) -> list[str]:
    """A relative link must point at a file or folder; its #anchor, if any, at a heading of the
    Markdown page it names (or of this page, for a bare #anchor)."""
    prose, _ = split_fences(text)
    problems = []
    for match in LINK.finditer("\n".join(prose)):
        target, _, anchor = match.group("target").partition("#")
        if re.match(r"^[a-z]+:", target):
            continue
        page = doc.parent / target if target else doc
        if not page.exists():
            problems.append(f"link ({match.group('target')}) points at nothing")
        elif anchor and page.suffix == ".md" and anchor not in heading_anchors(page.read_text(encoding="utf-8")):
            problems.append(f"link ({match.group('target')}): {page.name} has no heading #{anchor}")
    return problems


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation other than '-' and '_'
    dropped, each space a '-'; a repeated heading gets -1, -2, ..."""
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
        target, problem = resolve_file(head.group("path"), doc)
        node = find_definition(target, head.group("name")) if target is not None else None
        if node is None:
            problems.append(
                f"line {start}: excerpt of `{head.group(0)[1:].strip()}`: {problem or 'no such definition'}"
            )
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
                problems.append(f"line {offset}: `{code}` is {where} {head.group('path')}:{head.group('name')}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_file_name_and_test_exists(doc):
    problems = citation_problems(doc.read_text(encoding="utf-8"), doc)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file(doc):
    problems = link_problems(doc.read_text(encoding="utf-8"), doc)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_excerpt_is_copied_from_the_code(doc):
    problems = excerpt_problems(doc.read_text(encoding="utf-8"), doc)
    assert not problems, "\n".join(problems)


# the checker itself: each kind of wrong citation is caught -----------------------------------------

PAGE = ROOT / "docs" / "page.md"


@pytest.mark.parametrize(
    "text",
    [
        "`gan/steps.py:d_step`",  # the file moved
        "`gan/core/steps.py:d_stepp`",  # no such function
        "`gan/core/models.py:Discriminator.forward_with_features`",  # no such method
        "`training.py:train`",  # a bare name that no file has any more (gan/training.py moved)
        "`gan.steps.frozen`",  # no such module
        "`gan.core.steps.thawed`",  # no such name
        "`tests/test_techniques.py::test_nothing_like_this`",
        "| `test_techniques.py::test_d_step_leaves_generator_gradients_none`, `::test_nothing_like_this` |",
        "| `::test_d_step_leaves_generator_gradients_none` |",  # no file before it in its cell
        "`techniques::test_d_step_leaves_generator_gradients_none`",  # no prefix table on this page
        "| `walk::` | `tests/test_walkthrough.py` |\n\nSee `walk::test_d_step_leaves_generator_gradients_none`.",
        "`test_nothing_like_this`",
        "```\ngan/training.py   the loop\n```",  # a layout diagram names files too
        "```\ngan/lesson/        the lesson\n```",  # and folders
        "Under `tests/unit/`.",
    ],
)
def test_a_wrong_citation_is_caught(text):
    assert citation_problems(text, PAGE) != []


@pytest.mark.parametrize(
    "text",
    [
        "`gan/core/steps.py:d_step`, `gan/core/models.py:Discriminator.forward`, `models.py:Generator`",
        "`gan/core/steps.py:FP32`, `gan.core.steps.frozen`, `gan.training.train`, `dcgan/main.py`",
        "| `test_techniques.py::test_d_step_leaves_generator_gradients_none`, "
        "`::test_adam_skips_parameters_whose_grad_is_none` |",
        "| `walk::` | `tests/test_walkthrough.py` |\n\nSee `walk::test_gradients_accumulate_until_released[True]`.",
        "`python scripts/bench.py --rounds 3`",
    ],
)
def test_a_right_citation_passes(text):
    assert citation_problems(text, PAGE) == []


def test_an_excerpt_that_is_not_in_the_code_is_caught():
    good = "```python\n# gan/core/steps.py:release_grads\nfor p in module.parameters():\n    p.grad = None\n```"
    assert excerpt_problems(good, PAGE) == []
    swapped = "```python\n# gan/core/steps.py:release_grads\np.grad = None\nfor p in module.parameters():\n```"
    assert excerpt_problems(swapped, PAGE) != []
    edited = "```python\n# gan/core/steps.py:release_grads\nfor p in module.parameters():\n    p.grad.zero_()\n```"
    assert excerpt_problems(edited, PAGE) != []
    abridged = "```python\n# gan/core/steps.py:d_step\npenalties = ctx.penalties\n...\nrelease_grads(D)\n```"
    assert excerpt_problems(abridged, PAGE) == []


def test_a_broken_link_is_caught():
    assert link_problems("[x](../tests/test_claims.py)", PAGE) == []
    assert link_problems("[x](../tests/test_nothing.py)", PAGE) != []
    assert link_problems("[x](walkthrough.md#more-lessons)", PAGE) == []
    assert link_problems("[x](walkthrough.md#no-such-section)", PAGE) != []


def test_heading_anchors_follow_githubs_rule():
    text = "# A title\n## 3. (1) D step: `detach()`, `grad = None`\n## Notes\n## Notes\n"
    assert heading_anchors(text) == {"a-title", "3-1-d-step-detach-grad--none", "notes", "notes-1"}
