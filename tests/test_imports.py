"""The import graph of tpuops/ and trainer/ (read with ast): no cycle anywhere, and the two never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tpuops", "trainer")


def modules(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the packages (a package is its __init__)."""
    found: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(module: str, path: Path) -> set[str]:
    """Every module name an import statement in the file names (module level and inside functions alike),
    relative imports resolved; `from X import y` names X.y, which is X's attribute when no X.y module exists."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def graph(
    root: Path, packages: tuple[str, ...] = PACKAGES
) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges between our modules, every name each module imports). A name is resolved to the longest of its
    prefixes that is one of our modules: importing a package (or a name from its __init__) is an edge to
    its __init__. Parent packages imported implicitly on the way are not edges (Python allows those)."""
    mods = modules(root, packages)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    raw: dict[str, set[str]] = {}
    for m, path in mods.items():
        raw[m] = imported_names(m, path)
        for name in raw[m]:
            parts = name.split(".")
            prefixes = (".".join(parts[:n]) for n in range(len(parts), 0, -1))
            target = next((p for p in prefixes if p in mods), None)
            # A module's own name only counts when imported whole (`from pkg import x` inside pkg/__init__
            # names pkg.x, an attribute, when there is no module pkg.x: not a self-import).
            if target is not None and (target != m or name == m):
                edges[m].add(target)
    return edges, raw


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (first node repeated at the end) for each strongly connected component that has one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm, recursive: these graphs are a few hundred nodes
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    found = []
    for component in sorted(components):
        start = component[0]
        if len(component) == 1 and start not in edges.get(start, ()):
            continue
        found.append(_path_back(edges, start, set(component)))
    return found


def _path_back(edges: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    """A shortest path start -> ... -> start inside one component (breadth first)."""
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, ()) & within):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in a component without a cycle through it")


# ---- the finder on graphs whose answer is known ----
def test_the_cycle_finder_finds_each_cycle_and_nothing_in_a_dag() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"x": {"x"}, "y": set()}) == [["x", "x"]]
    two = cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}})
    assert two == [["a", "b", "a"], ["c", "d", "c"]]
    # A component with a long way round and a short one: the shortest cycle through its first node.
    assert cycles({"a": {"b", "d"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "d", "a"]]


def test_the_graph_reads_relative_function_level_and_package_imports(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "def f():\n    from .sub import c\n",
        "pkg/sub/__init__.py": "from ..a import thing\n",
        "pkg/sub/c.py": "import pkg.sub\nimport json\n",
        "other/__init__.py": "",
        "other/d.py": "from pkg import sub\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    edges, raw = graph(tmp_path, ("pkg", "other"))
    assert edges == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": {"pkg.a"},
        "pkg.sub.c": {"pkg.sub"},
        "other": set(),
        "other.d": {"pkg.sub"},
    }
    assert "json" in raw["pkg.sub.c"]
    assert cycles(edges) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.sub", "pkg.a"]]


# ---- the repository ----
def test_no_import_cycle_in_tpuops_or_trainer() -> None:
    edges, _ = graph(ROOT)
    assert len(edges) > 50  # the walk found the packages (an empty graph has no cycle either)
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize(("package", "forbidden"), [("trainer", "tpuops"), ("tpuops", "trainer")])
def test_tpuops_and_trainer_never_import_each_other(package: str, forbidden: str) -> None:
    _, raw = graph(ROOT)
    bad = sorted(
        f"{m} imports {name}"
        for m, names in raw.items()
        if m.split(".")[0] == package
        for name in names
        if name.split(".")[0] == forbidden
    )
    assert not bad, "\n".join(bad)


# Layers import only downward: cli/ -> run/ -> (checks/, sop/) -> logs/ -> transport/, cloud/.
BELOW_RUN = ("sop", "transport", "checks", "logs")
BELOW_SOP = ("logs", "transport")


def _upward(raw: dict[str, set[str]], lower: tuple[str, ...], upper: tuple[str, ...]) -> list[str]:
    """`m imports name` for each module of the lower packages that imports from an upper package."""

    def package(name: str) -> str:
        parts = name.split(".")
        return parts[1] if len(parts) > 1 and parts[0] == "tpuops" else ""

    return sorted(
        f"{m} imports {name}"
        for m, names in raw.items()
        if package(m) in lower
        for name in names
        if package(name) in upper
    )


def test_the_example_upward_import_is_found(tmp_path: Path) -> None:
    for name, text in {
        "tpuops/__init__.py": "",
        "tpuops/run/__init__.py": "",
        "tpuops/run/launch.py": "from tpuops.sop import executor\n",
        "tpuops/sop/__init__.py": "",
        "tpuops/sop/executor.py": "def f():\n    from tpuops.run.follow import Follower\n",
        "tpuops/logs/__init__.py": "",
        "tpuops/logs/follow.py": "from ..sop.actions import Follow\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    _, raw = graph(tmp_path, ("tpuops",))
    assert _upward(raw, BELOW_RUN, ("run",)) == ["tpuops.sop.executor imports tpuops.run.follow.Follower"]
    assert _upward(raw, BELOW_SOP, ("sop", "run", "checks")) == [
        "tpuops.logs.follow imports tpuops.sop.actions.Follow"
    ]


def test_no_module_below_run_imports_from_run() -> None:
    _, raw = graph(ROOT)
    assert any(m.startswith("tpuops.logs.") for m in raw)  # the packages checked exist
    bad = _upward(raw, BELOW_RUN, ("run", "cli"))
    assert not bad, "imports that point up (move the code down or pass it in):\n" + "\n".join(bad)


def test_the_log_reader_and_transports_import_nothing_from_sop_or_checks() -> None:
    _, raw = graph(ROOT)
    bad = _upward(raw, BELOW_SOP, ("sop", "checks", "run", "cli"))
    assert not bad, "imports that point up (move the code down or pass it in):\n" + "\n".join(bad)


def test_the_sideways_imports_the_architecture_forbids_are_gone() -> None:
    """The loose modules and config/ sit below every room (console and config import no room above them); checks/
    and sop/ stand side by side (checks/ takes .env reading from config/, not from sop/)."""
    _, raw = graph(ROOT)
    bad = _upward(
        raw, ("console", "config", "errors", "shell", "jsonout"), ("sop", "run", "cli", "checks", "logs")
    )
    bad += _upward(raw, ("checks",), ("sop",))
    assert not bad, "sideways imports:\n" + "\n".join(bad)
