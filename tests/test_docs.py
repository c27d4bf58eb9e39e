"""Every reference in README.md and docs/*.md resolves: `tests/...` paths (a file or folder, `file::test` a name
defined in that file), relative links and their `#anchor`s (as GitHub makes them from headings), `docs/*.md`
paths named in the text, and quoted section names (`docs/fit.md, "Multislice"`)."""

from __future__ import annotations

import ast
import re
import unicodedata
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
BOLD_LEAD = re.compile(r"\*\*(.+?)\*\*")
# A path under tests/, optionally with `::name` parts (a test, a class and its method) and a parametrize id.
TEST_REF = re.compile(r"(?<![\w/.-])(tests/[\w./*-]*[\w/*])((?:::\w+(?:\[[^\]\s`]*\])?)*)")
# `::test_name` on its own in backticks: a second test of the file named last on the same line.
TEST_MORE = re.compile(r"`::(\w+)(?:\[[^\]`]*\])?`")
LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
DOC_PATH = re.compile(r"(?<![\w/.\[-])(?<!\]\()(docs/[\w./-]+\.md)(#[\w-]+)?")  # not a link's target
SECTION = re.compile(r"((?:docs/)?[\w.-]+\.md)\)?,? \"([^\"]+)\"")


def prose(path: Path) -> Iterator[tuple[int, str, bool]]:
    """Each line of a markdown file with its number and whether it sits inside a fenced code block."""
    inside = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            yield number, line, True
            continue
        yield number, line, inside


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lowercased, every character that is not a letter, a
    digit, a mark, `_`, `-` or a space dropped, spaces made hyphens (github-slugger)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    kept = (c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return "".join(kept).replace(" ", "-")


@cache
def headings(path: Path) -> tuple[str, ...]:
    """The headings of a markdown file, code blocks left out."""
    found = []
    for _, line, code in prose(path):
        if not code and (m := HEADING.match(line)):
            found.append(m.group(2))
    return tuple(found)


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor GitHub gives the file's headings; a repeated one gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in headings(path):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


@cache
def section_names(path: Path) -> tuple[str, ...]:
    """What a quoted section name may name: a heading, or a list item's or paragraph's bold lead-in."""
    names = [h.replace("`", "").lower() for h in headings(path)]
    for _, line, code in prose(path):
        if not code:
            names += [m.group(1).replace("`", "").lower() for m in BOLD_LEAD.finditer(line)]
    return tuple(names)


@cache
def defined_names(path: Path) -> frozenset[str]:
    """Every function and class name defined anywhere in a Python file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, kinds))


def ref_problem(root: Path, ref: str, names: list[str]) -> str | None:
    """What is wrong with a `tests/...` reference (None when it resolves)."""
    if "*" in ref:
        return None if list(root.glob(ref)) else f"{ref}: matches no file"
    target = root / ref
    if not target.exists():
        return f"{ref}: no such file or folder"
    if names and target.suffix == ".py":
        missing = [n for n in names if n not in defined_names(target)]
        if missing:
            return f"{ref}: defines no {', '.join(missing)}"
    return None


def resolve(doc: Path, target: str) -> Path:
    """A relative path as GitHub resolves it in `doc`: from the file's folder."""
    return (doc.parent / target).resolve()


def problems(doc: Path, root: Path = ROOT) -> Iterator[str]:
    """Every broken reference of one markdown file of the repository at `root`, as `file:line: what`."""
    name = doc.relative_to(root).as_posix()
    for number, line, code in prose(doc):
        where = f"{name}:{number}"
        refs: list[tuple[int, str]] = []  # (where it starts, the file or folder)
        for m in TEST_REF.finditer(line):
            ref = m.group(1).rstrip(".")
            parts = [p.split("[")[0] for p in m.group(2).split("::") if p]
            refs.append((m.start(), ref))
            if (problem := ref_problem(root, ref, parts)) is not None:
                yield f"{where}: {problem}"
        for m in TEST_MORE.finditer(line):
            before = [ref for start, ref in refs if start < m.start()]
            if not before:
                yield f"{where}: ::{m.group(1)}: no tests/ file before it on the line"
            elif (problem := ref_problem(root, before[-1], [m.group(1)])) is not None:
                yield f"{where}: {problem}"
        if code:
            continue
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # https:, mailto:: not a file of this repository
            path_part, _, anchor = target.partition("#")
            path = resolve(doc, path_part) if path_part else doc
            if not path.exists():
                yield f"{where}: link {target}: no such file"
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                yield f"{where}: link {target}: {path.name} has no heading with anchor #{anchor}"
        for m in DOC_PATH.finditer(line):
            path = root / m.group(1)
            if not path.exists():
                yield f"{where}: {m.group(1)}: no such file"
            elif m.group(2) and m.group(2)[1:] not in anchors(path):
                yield f"{where}: {m.group(0)}: {path.name} has no heading with that anchor"
        for m in SECTION.finditer(line):
            file, section = m.groups()
            candidates = [resolve(doc, file), root / file]
            found = next((p for p in candidates if p.exists()), None)
            if found is None:
                yield f"{where}: {file}: no such file"
            elif not any(section.lower() in s for s in section_names(found)):
                yield f'{where}: {file}, "{section}": no heading or bold lead-in by that name'


def test_slugs_are_githubs() -> None:
    assert slug("Multislice: several slices as one VM") == "multislice-several-slices-as-one-vm"
    assert slug("The default job: `--config arith` (what `tpuops run grpo --local` runs)") == (
        "the-default-job---config-arith-what-tpuops-run-grpo---local-runs"
    )
    assert slug("Step lines: `step_pattern`") == "step-lines-step_pattern"
    assert slug("4. JSON output: numbers that are not finite") == "4-json-output-numbers-that-are-not-finite"


def test_the_checker_finds_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("class TestB:\n    def test_c(self) -> None: ...\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# A heading\n"
        "`tests/test_a.py::TestB::test_c[x-1]`, `::no_such_test` and `tests/no_such_file.py`, `tests/x*.py`.\n"
        "[here](#a-heading), [gone](#no-heading), [missing](nothing.md)\n"
        "```bash\n# not a heading\n```\n"
        '[self](doc.md#not-a-heading) and doc.md, "A heading" and doc.md, "Nothing" (docs/nothing.md)\n',
        encoding="utf-8",
    )
    assert list(problems(doc, tmp_path)) == [
        "doc.md:2: tests/no_such_file.py: no such file or folder",
        "doc.md:2: tests/x*.py: matches no file",
        "doc.md:2: tests/test_a.py: defines no no_such_test",
        "doc.md:3: link #no-heading: doc.md has no heading with anchor #no-heading",
        "doc.md:3: link nothing.md: no such file",
        "doc.md:7: link doc.md#not-a-heading: doc.md has no heading with anchor #not-a-heading",
        "doc.md:7: docs/nothing.md: no such file",
        'doc.md:7: doc.md, "Nothing": no heading or bold lead-in by that name',
    ]


def test_every_reference_in_the_readme_and_docs_resolves() -> None:
    broken = [p for doc in DOCS for p in problems(doc)]
    assert not broken, "broken references:\n" + "\n".join(broken)


def _modules(root: Path) -> set[str]:
    """Each module of tpuops/ as the architecture names it (`launch.py`), the emulator's and `__init__` aside."""
    return {
        p.name
        for p in (root / "tpuops").rglob("*.py")
        if p.stem != "__init__" and "emulator" not in p.relative_to(root).parts
    }


def unnamed_and_unknown(doc: str, root: Path) -> tuple[list[str], list[str]]:
    """The modules of tpuops/ that docs/architecture.md never names, and the `x.py` it names that no module of
    tpuops/, trainer/ or tests/ is."""
    named = set(re.findall(r"`(?:[\w/]+/)?(\w+\.py)`", doc))
    named |= set(re.findall(r"(?<![\w/.])(\w+\.py)\b", doc))
    have = _modules(root)
    known = {p.name for d in ("tpuops", "trainer", "tests") for p in (root / d).rglob("*.py")}
    return sorted(have - named), sorted(n for n in named - known if n != "setup.py")


def test_the_module_check_finds_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "tpuops" / "run").mkdir(parents=True)
    for name in ("run/launch.py", "run/finish.py", "run/__init__.py"):
        (tmp_path / "tpuops" / name).write_text("")
    for d in ("trainer", "tests"):
        (tmp_path / d).mkdir()
    doc = "`run/launch.py` starts; `gone.py` is named but missing."
    assert unnamed_and_unknown(doc, tmp_path) == (["finish.py"], ["gone.py"])


def test_the_architecture_names_every_module_and_only_modules_that_exist() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    unnamed, unknown = unnamed_and_unknown(doc, ROOT)
    assert not unnamed, f"docs/architecture.md does not name these modules of tpuops/: {unnamed}"
    assert not unknown, f"docs/architecture.md names modules that do not exist: {unknown}"
