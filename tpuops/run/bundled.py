"""The bundled trainer as a git repository of its own, made from the installed `trainer/` package: what a SOP
marked `trainer: true` syncs when no repository names another (a wheel install, a folder that is not a
checkout of tpuops). Made once per tpuops version and content under the state home, reproducibly (fixed author
and date: the same files give the same commit), with a `git bundle` of it that a VM's workers clone from."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tpuops.config import private_dir, state_home
from tpuops.errors import UsageError

# The bundled trainer's one home on a worker (run/tree.repo_home of this name): every tpuops version syncs into
# the same checkout and fills the same venv, so versions replace each other instead of piling up.
URL = "bundled://tpuops/trainer"
EXTRAS = ("trainer", "tpu")  # the installed tpuops's extras the trainer's pyproject.toml declares as its own
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")
_EXTRA = re.compile(r"""\s*extra\s*==\s*["']([^"']+)["']\s*""")
_FIXED = {
    "GIT_AUTHOR_NAME": "tpuops", "GIT_AUTHOR_EMAIL": "tpuops@localhost", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "tpuops", "GIT_COMMITTER_EMAIL": "tpuops@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
}  # fmt: skip


@dataclass(frozen=True)
class Bundled:
    """The bundled trainer's repository here: its folder (locally the repository to sync), its one commit and
    the `git bundle` of it (what a VM's workers fetch from)."""

    repo: Path
    commit: str
    bundle: Path
    version: str


def source() -> Path | None:
    """The `trainer/` package installed with this tpuops (found, never imported: no jax in the CLI). The
    distribution's own file first (a wheel install), else where the import system would find it (an
    editable install, a checkout on the path)."""
    try:
        own = Path(str(importlib.metadata.distribution("tpuops").locate_file("trainer/__init__.py")))
        if own.is_file():
            return own.parent
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("trainer")
    places = list(spec.submodule_search_locations or []) if spec else []
    found = Path(places[0]) if places else None
    return found if found is not None and (found / "main.py").is_file() else None


def version() -> str:
    try:
        return importlib.metadata.version("tpuops")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def extras(requires: list[str] | None = None) -> dict[str, list[str]]:
    """The `trainer` and `tpu` extras of the installed tpuops (or of `requires`, lines as its metadata has them),
    requirement by requirement: the extra's marker taken off, any other marker kept."""
    if requires is None:
        try:
            requires = importlib.metadata.requires("tpuops") or []
        except importlib.metadata.PackageNotFoundError:
            requires = []
    found: dict[str, list[str]] = {e: [] for e in EXTRAS}
    for line in requires:
        req, _, marker = line.partition(";")
        m = _EXTRA.search(marker)
        if not m or m.group(1) not in found:
            continue
        rest = re.sub(r"^\s*and\s+|\s+and\s*$", "", (marker[: m.start()] + marker[m.end() :]).strip())
        found[m.group(1)].append(req.strip() + (f"; {rest}" if rest.strip() else ""))
    return found


def pyproject(ver: str, extra: dict[str, list[str]]) -> str:
    """The trainer's own pyproject.toml: the package `trainer` and its data, the extras as tpuops declares them."""

    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join('"' + i.replace("\\", "\\\\").replace('"', '\\"') + '"' for i in items) + "]"

    lines = [
        "# Made by tpuops from its installed trainer/ package: the trainer of tpuops " + ver + ".",
        "[build-system]",
        'requires = ["setuptools>=68"]',
        'build-backend = "setuptools.build_meta"',
        "",
        "[project]",
        'name = "tpuops-trainer"',
        f'version = "{ver}"',
        'description = "The GRPO trainer bundled with tpuops"',
        'requires-python = ">=3.11"',
        "dependencies = []",
        "",
        "[project.optional-dependencies]",
        *(f"{name} = {toml_list(reqs)}" for name, reqs in extra.items()),
        "",
        "[tool.setuptools.packages.find]",
        'include = ["trainer*"]',
        "",
        "[tool.setuptools.package-data]",
        'trainer = ["configs/*.yaml", "assets/tokenizer/*"]',
        "",
    ]
    return "\n".join(lines)


def _digest(src: Path, project: str) -> str:
    h = hashlib.sha256(project.encode())
    for path in sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        if path.suffix in (".pyc", ".pyo"):
            continue
        h.update(b"\0" + str(path.relative_to(src)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def _git(cwd: Path, *args: str) -> str:
    try:
        r = subprocess.run(
            ["git", "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false", *args],
            cwd=cwd, capture_output=True, text=True, timeout=120, check=False, env={**os.environ, **_FIXED},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(f"the bundled trainer's repository could not be made: git {args[0]}: {e}") from None
    if r.returncode != 0:
        raise UsageError(
            f"the bundled trainer's repository could not be made: git {args[0]}: {r.stderr.strip()}",
            hint="install git, or pass --set repo_url=URL of a repository that holds the trainer",
        )
    return r.stdout.strip()


def make() -> Bundled:
    """The repository of the installed trainer (made at first use, then reused while the files are the same):
    `$TPUOPS_HOME/bundled/trainer-<version>-<hash>/` holding `trainer/` and a generated pyproject.toml in one
    commit on `main`, and `trainer-<version>-<hash>.bundle` beside it."""
    src = source()
    if src is None:
        raise UsageError(
            "this tpuops has no trainer package installed to run",
            hint="install tpuops with its trainer (pip install 'tpuops[trainer]'), or pass --set repo_url=URL",
        )
    ver = version()
    project = pyproject(ver, extras())
    name = f"trainer-{re.sub(r'[^A-Za-z0-9._+-]', '_', ver)}-{_digest(src, project)}"
    home = private_dir(state_home() / "bundled")
    repo, bundle = home / name, home / f"{name}.bundle"
    if not (bundle.is_file() and (repo / ".git").is_dir()):
        _build(src, project, repo, bundle)
    return Bundled(repo, _git(repo, "rev-parse", "HEAD"), bundle, ver)


def _build(src: Path, project: str, repo: Path, bundle: Path) -> None:
    """Made in a scratch folder beside the final one, then renamed into place: two runs at once make it twice
    and one rename wins; a half-made repository is never used."""
    with tempfile.TemporaryDirectory(prefix=".making-", dir=repo.parent) as scratch:
        work = Path(scratch) / "repo"
        shutil.copytree(src, work / "trainer", ignore=_SKIP)
        (work / "pyproject.toml").write_text(project)
        _git(work, "init", "-q", "--template=")
        _git(work, "symbolic-ref", "HEAD", "refs/heads/main")
        _git(work, "add", "-A", ".")
        _git(work, "commit", "-q", "--no-verify", "-m", "The trainer bundled with tpuops")
        made = Path(scratch) / "trainer.bundle"
        _git(work, "bundle", "create", "-q", str(made), "HEAD", "main")
        try:
            work.rename(repo)
        except OSError:  # made meanwhile by another run: the same files, the same commit
            if not (repo / ".git").is_dir():
                raise
        made.replace(bundle)


def describe(url: str) -> str | None:
    """The one line a run says when it syncs the bundled trainer (None for any other repository)."""
    path = Path(url)
    if path.parent != state_home() / "bundled" or not (path / ".git").is_dir():
        return None
    commit = _git(path, "rev-parse", "--short=7", "HEAD")
    return (
        f"trainer: the one installed with tpuops {version()} ({source()}), as commit {commit} of {path}; "
        "--set repo_url=URL runs another repository's"
    )
