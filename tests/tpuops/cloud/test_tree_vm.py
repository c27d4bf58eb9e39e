"""Your tree as it is, on an emulated two-worker VM (the TPU API emulator, real sshd workers): an uncommitted edit
and an untracked file run on both workers, the run folder keeps the change, the user's checkout is untouched;
`sync=commit` refuses the same tree; two repositories get two homes (checkout and environment) on one VM."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tests.tpuops.cloud.vms import Vm, create_vm, tpuops
from tpuops.run.tree import repo_home

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
SHOW = """import os, pathlib, sys
print("step=0 loss=1.0 time=0.1")
print("says:", pathlib.Path("message.txt").read_text().strip())
extra = pathlib.Path("extra file \\u00e9.txt")
print("extra:", extra.read_text().strip() if extra.exists() else "absent")
print("cwd:", os.getcwd())
print("prefix:", sys.prefix)
try:
    import jax  # noqa: F401
    print("jax: yes")
except ImportError:
    print("jax: no")
print("step=1 loss=0.5 time=0.1")
"""

pytestmark = pytest.mark.slow


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    yield from _project(tmp_path, "proj-a")


@pytest.fixture
def other_project(tmp_path: Path) -> Iterator[Path]:
    yield from _project(tmp_path, "proj-b")


def _project(tmp_path: Path, name: str) -> Iterator[Path]:
    """A user's checkout with an empty requirements.txt, its origin a bare repository every worker can read."""
    work, bare = tmp_path / name, Path("/tmp") / f"tpuops-tree-{os.getpid()}-{tmp_path.name}-{name}.git"
    work.mkdir()
    (work / "show.py").write_text(SHOW)
    (work / "message.txt").write_text("committed\n")
    (work / "requirements.txt").write_text("")
    subprocess.run([*GIT, "init", "-q", str(work)], check=True)
    subprocess.run([*GIT, "-C", str(work), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(work), "commit", "-qm", "base"], check=True)
    subprocess.run([*GIT, "init", "-q", "--bare", str(bare)], check=True)
    subprocess.run([*GIT, "-C", str(work), "remote", "add", "origin", str(bare)], check=True)
    subprocess.run([*GIT, "-C", str(work), "push", "-q", "origin", "HEAD:main"], check=True)
    subprocess.run([*GIT, "-C", str(work), "fetch", "-q", "origin"], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(bare)], check=True)
    yield work
    subprocess.run(["rm", "-rf", str(bare)], check=True)


def _state(repo: Path) -> tuple[bytes, bytes]:
    status = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain=v1", "-uall"], capture_output=True, check=True
    )
    return status.stdout, (repo / ".git" / "index").read_bytes()


def _run(vm: Vm, repo: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    args = ["run", "job", *vm.target(), "--json", "--set", "lockfile=~/libtpu_lockfile"]
    for s in sets:
        args += ["--set", s]
    return tpuops(vm.cloud, [*args, "--", "python", "-u", "show.py"], repo)


def _logs(run_id: str) -> list[str]:
    local = Path(os.environ["TPUOPS_HOME"]) / "runs" / run_id
    return [(local / f"worker-{k}.log").read_text() for k in (0, 1)]


def _said(log: str, key: str) -> str:
    return next(ln.split(": ", 1)[1] for ln in log.splitlines() if ln.startswith(f"{key}: "))


def test_an_uncommitted_edit_and_an_untracked_file_run_on_both_workers(
    cloud: Cloud, vm_name: str, project: Path, worker_python: str, tmp_path: Path
) -> None:
    vm = create_vm(cloud, vm_name, "v4-16", {}, tmp_path)
    (project / "message.txt").write_text("edited, not committed\n")
    (project / "extra file é.txt").write_text("untracked\n")
    before = _state(project)

    r = _run(vm, project, f"python={worker_python}")

    assert r.returncode == 0, r.stderr[-4000:]
    assert "uncommitted: M message.txt, ?? extra file é.txt" in r.stderr  # said before anything starts
    data = json.loads(r.stdout)
    for log in _logs(data["run_id"]):
        assert _said(log, "says") == "edited, not committed" and _said(log, "extra") == "untracked"
    sync = next(s for s in data["steps"] if s["kind"] == "git_sync")
    assert all("+ uncommitted (patch " in w["detail"] for w in sync["workers"].values()), sync
    kept = Path(os.environ["TPUOPS_HOME"]) / "runs" / data["run_id"] / "tree.patch"
    assert b"edited, not committed" in kept.read_bytes() and b"extra file" in kept.read_bytes()
    assert _state(project) == before  # the user's status and index, byte for byte

    again = _run(vm, project, f"python={worker_python}")  # the same tree again: the applied patch is ours
    assert again.returncode == 0, again.stderr[-4000:]
    sync = next(s for s in json.loads(again.stdout)["steps"] if s["kind"] == "git_sync")
    assert {w["status"] for w in sync["workers"].values()} == {"nothing"}, sync
    assert "stashed" not in again.stderr

    refused = _run(vm, project, f"python={worker_python}", "sync=commit")
    assert refused.returncode == 2, refused.stderr
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.startswith("error: ")]
    assert "sync=commit" in line and "M message.txt, ?? extra file é.txt" in line, line
    assert _state(project) == before


def test_two_repositories_get_two_homes_on_one_vm(
    cloud: Cloud, vm_name: str, project: Path, other_project: Path, tmp_path: Path
) -> None:
    """Each project's checkout and venv (made by the workers' python3 from its own empty requirements.txt): the
    second run changes nothing of the first's, and neither environment has another project's packages."""
    vm = create_vm(cloud, vm_name, "v4-16", {}, tmp_path)
    seen = []
    for repo in (project, other_project):
        r = _run(vm, repo, "python=python3")
        assert r.returncode == 0, r.stderr[-4000:]
        seen.append(_logs(json.loads(r.stdout)["run_id"]))
    (a0, _), (b0, _) = seen
    assert _said(a0, "cwd") != _said(b0, "cwd") and _said(a0, "prefix") != _said(b0, "prefix")
    for log in (a0, b0):
        assert _said(log, "jax") == "no"  # a venv of the project's own requirements only
    home_a = repo_home(subprocess.run(
        ["git", "-C", str(project), "remote", "get-url", "origin"], capture_output=True, text=True, check=True
    ).stdout.strip()).removeprefix("~/")  # fmt: skip
    assert _said(a0, "cwd") == str(vm.homes[0] / home_a / "checkout")
    assert (vm.homes[0] / home_a / "checkout" / "message.txt").read_text() == "committed\n"  # untouched by b
