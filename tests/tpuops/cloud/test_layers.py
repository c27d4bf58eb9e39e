"""tpuops.cloud is a layer below tpuops.run: run/target.py calls into it, it never imports back."""

from __future__ import annotations

import ast
from pathlib import Path

CLOUD = Path(__file__).resolve().parents[3] / "tpuops" / "cloud"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at module level or inside functions (relative imports resolved)."""
    package = ".".join(path.relative_to(CLOUD.parents[1]).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def test_nothing_in_cloud_imports_the_run_package() -> None:
    files = sorted(CLOUD.rglob("*.py"))
    assert len(files) > 10  # the walk found the package
    upward = {
        f"{p.relative_to(CLOUD.parents[1])}: {m}"
        for p in files
        for m in _imports(p)
        if m == "tpuops.run" or m.startswith(("tpuops.run.", "tpuops.cli", "tpuops.checks"))
    }
    assert not upward, upward
