"""The rooms' bounds (docs/architecture.md): modules of at most MAX_LINES lines in every folder we write, at most
MAX_LOOSE loose modules in tpuops/, function bodies of at most MAX_BODY lines, no branch on a VM's API outside
tpuops/cloud/, and `Any` rare."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MAX_LINES = 400  # a module past this is split by what it does (docs/architecture.md)
WRITTEN = ("tpuops", "trainer", "bench", "tests", "scripts")  # every folder of Python we write
MAX_LOOSE = 5  # modules sitting directly in tpuops/ besides __init__ and __main__


def _line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def _tpuops_modules() -> list[Path]:
    return sorted((ROOT / "tpuops").rglob("*.py"))


def long_modules(root: Path, folders: tuple[str, ...] = WRITTEN) -> dict[str, int]:
    """Every module under root/<folder> over MAX_LINES: its path (relative to root) -> its lines."""
    return {
        p.relative_to(root).as_posix(): n
        for folder in folders
        for p in sorted((root / folder).rglob("*.py"))
        if (n := _line_count(p)) > MAX_LINES
    }


def loose_modules(root: Path) -> list[str]:
    """The modules directly in root/tpuops (not in a package), __init__ and __main__ aside."""
    return sorted(p.name for p in (root / "tpuops").glob("*.py") if p.stem not in ("__init__", "__main__"))


def test_the_bounds_are_measured(tmp_path: Path) -> None:
    (tmp_path / "tpuops" / "pkg").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tpuops" / "__init__.py").write_text("")
    (tmp_path / "tpuops" / "pkg" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "tpuops" / "pkg" / "small.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "tests" / "test_big.py").write_text("x = 1\n" * (MAX_LINES + 2))
    for k in range(MAX_LOOSE + 1):
        (tmp_path / "tpuops" / f"loose{k}.py").write_text("")
    assert long_modules(tmp_path) == {"tpuops/pkg/big.py": MAX_LINES + 1, "tests/test_big.py": MAX_LINES + 2}
    assert len(loose_modules(tmp_path)) == MAX_LOOSE + 1


def test_no_cloud_module_is_over_the_bound() -> None:
    assert any(p.is_relative_to(ROOT / "tpuops" / "cloud") for p in _tpuops_modules())
    over = {p: n for p, n in long_modules(ROOT).items() if p.startswith("tpuops/cloud/")}
    assert not over, f"split by responsibility (at most {MAX_LINES} lines): {over}"


def test_no_module_is_over_the_bound() -> None:
    over = long_modules(ROOT)
    assert not over, f"split by responsibility (at most {MAX_LINES} lines): {over}"


def test_at_most_five_loose_modules() -> None:
    loose = loose_modules(ROOT)
    assert len(loose) <= MAX_LOOSE, f"{len(loose)} loose modules in tpuops/: {', '.join(loose)}"


# A branch on which API a VM came from: `vm.kind == "mig"`, `before.api == 'compute'`, `.kind in ("node", ...)`.
_API_BRANCH = re.compile(
    r"""\.(?:kind|api)\s*(?:==|!=|\bin\b|\bnot in\b)\s*[(\[{]?\s*["'](?:node|multislice|instance|mig|tpu|compute)["']"""
)


def api_branches(root: Path) -> list[str]:
    """`path:line: text` of each branch on a VM's API or kind outside tpuops/cloud/ (the backends decide)."""
    out = []
    for path in sorted((root / "tpuops").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("tpuops/cloud/"):
            continue
        for k, line in enumerate(path.read_text().splitlines(), 1):
            if _API_BRANCH.search(line):
                out.append(f"{rel}:{k}: {line.strip()}")
    return out


def test_the_api_branch_pattern_finds_what_it_should(tmp_path: Path) -> None:
    (tmp_path / "tpuops" / "run").mkdir(parents=True)
    (tmp_path / "tpuops" / "cloud").mkdir()
    (tmp_path / "tpuops" / "run" / "a.py").write_text(
        'if vm.kind == "mig":\n    pass\nif before.api == \'compute\': pass\nif step.kind == "run": pass\n'
        'ok = v.kind in ("node", "instance")\n'
    )
    (tmp_path / "tpuops" / "cloud" / "b.py").write_text('if vm.kind == "mig":\n    pass\n')
    assert [b.split(":")[1] for b in api_branches(tmp_path)] == ["1", "3", "5"]


def test_nothing_outside_cloud_branches_on_a_vms_api() -> None:
    found = api_branches(ROOT)
    assert not found, "ask tpuops.cloud.backends.backend_of(vm) instead:\n" + "\n".join(found)


MAX_ANY = 20  # lines naming `Any` in tpuops/ outside the emulator (which may keep looser types)
_ANY = re.compile(r"\bAny\b")


def any_lines(root: Path) -> list[str]:
    """`path:line` of each line of a .py file under root/tpuops, outside tpuops/cloud/emulator, that names `Any`
    as a word (what `grep -rw Any tpuops --include=*.py` counts)."""
    out = []
    for path in sorted((root / "tpuops").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("tpuops/cloud/emulator/"):
            continue
        out += [f"{rel}:{k}" for k, line in enumerate(path.read_text().splitlines(), 1) if _ANY.search(line)]
    return out


def test_the_any_count_counts_words_outside_the_emulator(tmp_path: Path) -> None:
    (tmp_path / "tpuops" / "cloud" / "emulator").mkdir(parents=True)
    (tmp_path / "tpuops" / "a.py").write_text(
        "from typing import Any\nx: Any = 1\nAnyway = 2\ny: dict[str, Any] = {}  # Any\n"
    )
    (tmp_path / "tpuops" / "cloud" / "emulator" / "b.py").write_text("z: Any = 1\n")
    (tmp_path / "tpuops" / "c.txt").write_text("Any\n")
    assert any_lines(tmp_path) == ["tpuops/a.py:1", "tpuops/a.py:2", "tpuops/a.py:4"]


def test_any_is_rare_outside_the_emulator() -> None:
    found = any_lines(ROOT)
    assert len(found) < MAX_ANY, (
        f"{len(found)} lines name Any in tpuops/ outside the emulator (at most {MAX_ANY - 1}): a TypedDict or a "
        "dataclass for a JSON shape, `object` and narrowing for a value truly unknown:\n" + "\n".join(found)
    )


MAX_BODY = (
    60  # lines of a function's body (its signature and docstring aside) before it is split by what it does
)


def long_functions(root: Path) -> list[str]:
    """`path:name (n lines)` of each function in tpuops/ (the emulator aside) whose body is over MAX_BODY lines."""
    out = []
    for path in sorted((root / "tpuops").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("tpuops/cloud/emulator/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body
            if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # the docstring
            lines = (node.end_lineno or node.lineno) - body[0].lineno + 1
            if lines > MAX_BODY:
                out.append(f"{rel}:{node.name} ({lines} lines)")
    return out


def test_the_function_bound_is_measured(tmp_path: Path) -> None:
    (tmp_path / "tpuops").mkdir()
    long_body = "\n".join(f"    x{i} = {i}" for i in range(MAX_BODY + 1))
    short_body = "\n".join(f"    y{i} = {i}" for i in range(MAX_BODY))
    (tmp_path / "tpuops" / "m.py").write_text(
        f'def long():\n    """Doc."""\n{long_body}\n\n\ndef short(\n    a: int,\n):\n    """Doc."""\n{short_body}\n'
    )
    assert long_functions(tmp_path) == [f"tpuops/m.py:long ({MAX_BODY + 1} lines)"]


def test_no_function_body_is_over_the_bound() -> None:
    over = long_functions(ROOT)
    assert not over, f"split by what each part does (a body of at most {MAX_BODY} lines): {over}"
