"""tpuops as a package: a wheel installed without -e has its built-in SOPs and runs; the base dependencies are
enough for the CLI (a plain `pip install -e .`, no extras)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
BUILTINS = {"exec", "gradcheck", "grpo", "microbench", "recompile-check", "smoke", "sync"}


def _run(
    argv: list[str], cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    own = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(  # noqa: PLW1510 - the exit code is what these tests check
        argv,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**own, "COLUMNS": "200", **(env or {})},
    )


def _venv(venv: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """A fresh venv without its own pip (ensurepip's install is seconds of CPU): `_pip` installs into it."""
    return _run([sys.executable, "-m", "venv", "--without-pip", *options, str(venv)], venv.parent)


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """This interpreter's pip installing into the venv of `python` (`pip --python`), without compiling each
    installed module's bytecode (Python does that on first import; at install it was a third of pip's CPU)."""
    argv = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
            "--disable-pip-version-check", *args]  # fmt: skip
    return _run(argv, python.parent.parent.parent, 600)


def _see_the_running_environment(venv: Path) -> None:
    """A venv whose system packages are this interpreter's environment, not only its base: `--system-site-packages`
    reaches the base interpreter's site-packages, which lack the packages of a venv the tests run in. A .pth file
    adds the running environment's site-packages after the new venv's own (so tpuops comes from the wheel)."""
    site = Path("lib") / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    if sys.prefix != sys.base_prefix:
        line = f"import site; site.addsitedir({str(Path(sys.prefix) / site)!r})\n"
        (venv / site / "_tpuops_tests_running_env.pth").write_text(line)


def _source_copy(dest: Path) -> Path:
    """What a wheel is built from, copied out of the checkout (the build leaves its build/ folder there)."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for pkg in ("tpuops", "trainer"):
        shutil.copytree(REPO / pkg, dest / pkg, ignore=ignore)
    return dest


@pytest.mark.slow
def test_a_wheel_installed_without_e_lists_and_plans_the_built_in_sops(tmp_path: Path) -> None:
    # A fresh venv; its dependencies come from this interpreter's site-packages, tpuops only from the wheel.
    venv = tmp_path / "venv"
    py, tpuops = _wheel_in_a_venv(tmp_path, venv)
    away = tmp_path / "elsewhere"  # not a checkout: nothing beside it to guess from
    away.mkdir()
    where = _run([str(py), "-c", "import tpuops; print(tpuops.__file__)"], away)
    assert where.stdout.startswith(str(venv)), where.stdout  # the installed copy, not this checkout

    helped = _run([str(tpuops), "--help"], away)
    assert helped.returncode == 0 and "sop" in helped.stdout, helped.stderr
    listed = _run([str(tpuops), "sop", "list", "--json"], away)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert {r["name"] for r in rows} >= BUILTINS
    assert all(r["path"].startswith(str(venv)) and r["error"] is None for r in rows if r["name"] in BUILTINS)
    # A repository named with --set is the one synced (here: this checkout), not the trainer the wheel installed.
    planned = _run(
        [str(tpuops), "run", "grpo", "--local", "--dry-run", "--verbose", "--set", f"repo_url={REPO}"], away
    )
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "== follow" in planned.stdout and '"$py" -m trainer.main --config arith' in planned.stdout


@pytest.mark.slow
def test_a_wheel_runs_the_trainer_it_installed(tmp_path: Path) -> None:
    """No repository named, none here: `run grpo --local` syncs the trainer the wheel installed (a git repository
    made from it under the state home) and trains it; the trainer's own packages come from the running
    environment (as `pip install 'tpuops[trainer]'` would have put them)."""
    venv, away, home = tmp_path / "venv", tmp_path / "elsewhere", tmp_path / "state"
    _, tpuops = _wheel_in_a_venv(tmp_path, venv)
    away.mkdir()
    env = {"TPUOPS_HOME": str(home)}

    planned = _run([str(tpuops), "run", "grpo", "--local", "--dry-run"], away, env=env)
    assert planned.returncode == 0, planned.stderr[-3000:]
    (repo,) = (home / "bundled").glob("trainer-0.1.0-*/")
    commit = _run(["git", "-C", str(repo), "rev-parse", "HEAD"], away).stdout.strip()
    installed = (
        venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" / "trainer"
    )
    assert f"trainer: the one installed with tpuops 0.1.0 ({installed})" in planned.stderr
    assert f"check out {commit} of {repo}" in planned.stderr + planned.stdout
    assert (repo / "trainer" / "main.py").read_bytes() == (installed / "main.py").read_bytes()
    # the wheel's own extras (its metadata sorts a requirement's specifiers: compared as packaging reads them)
    made = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tpu"]
    ours = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tpu"]
    assert [str(Requirement(r)) for r in made] == [str(Requirement(r)) for r in ours]

    ran = _run([str(tpuops), "run", "grpo", "--local", "--set", "steps=2"], away, timeout=600, env=env)
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert "steps 2," in ran.stdout + ran.stderr and f"changed at {commit[:7]}" in ran.stdout + ran.stderr


def _wheel_in_a_venv(tmp_path: Path, venv: Path) -> tuple[Path, Path]:
    """tpuops built as a wheel and installed without -e into a fresh venv that sees the running environment."""
    (tmp_path / "src").mkdir()
    src = _source_copy(tmp_path / "src")
    built = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                  str(tmp_path / "wheel"), str(src)], tmp_path)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("tpuops-*.whl")
    assert _venv(venv, "--system-site-packages").returncode == 0
    _see_the_running_environment(venv)
    py = venv / "bin" / "python"
    put = _pip(py, "--no-deps", "--no-index", str(wheel))
    assert put.returncode == 0, put.stderr[-3000:]
    return py, venv / "bin" / "tpuops"


def test_the_cli_s_imports_are_base_dependencies() -> None:
    """Every third-party package tpuops/ imports is declared in [project] dependencies (the extras are the
    trainer's): a plain `pip install .` runs every command."""
    declared = {
        d.split(">")[0].split("=")[0].split("[")[0].strip().lower()
        for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    provides = {"yaml": "pyyaml", "dotenv": "python-dotenv", "google": "google-api-core", "grpc": "grpcio"}
    found: set[str] = set()
    for path in (REPO / "tpuops").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    third_party = {m for m in found if m not in sys.stdlib_module_names and m not in ("tpuops", "__future__")}
    missing = sorted(m for m in third_party if provides.get(m, m).lower() not in declared)
    assert not missing, f"imported by tpuops/ but not in [project] dependencies: {missing}"


@pytest.mark.slow
def test_pip_install_e_without_extras_runs_the_cli(tmp_path: Path) -> None:
    """A venv of its own (no system packages): the base dependencies from the package index, tpuops editable."""
    venv, src = tmp_path / "venv", tmp_path / "src"
    src.mkdir()
    assert _venv(venv).returncode == 0
    put = _pip(venv / "bin" / "python", "-e", str(_source_copy(src)))
    if put.returncode != 0 and "No matching distribution" in put.stderr:
        pytest.skip(f"the package index here lacks a base dependency: {put.stderr[-500:]}")
    assert put.returncode == 0, put.stderr[-3000:]
    helped = _run([str(venv / "bin" / "tpuops"), "--help"], tmp_path)
    assert helped.returncode == 0 and "Usage" in helped.stdout, helped.stderr[-2000:]
