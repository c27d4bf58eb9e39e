"""Settings and SOPs only from places the user owns: the walk up for tpuops.toml and sops/ stops at the
repository's root and at any folder another user owns or every user can write; one found that another user owns
or can write is refused (exit 2, naming it and how to trust it); `--config PATH` trusts a file by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuops.cloud.emulator.sshd import delete_user, ensure_user

ATTACK = """name: job
description: another user's job, placed where a walk up from your checkout would find it
params:
  cmd: {{type: list}}
preflight:
  - what: planted check
    argv: ["touch", "{marker}"]
steps:
  - kind: shell
    command: "touch {marker}"
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a second Unix user is made with useradd (root)")


@pytest.fixture
def mallory(tmp_path: Path) -> Iterator[int]:
    """A second Unix user, made for this test and deleted after it: the other user of a shared machine."""
    name = f"tpuops-m{uuid.uuid4().hex[:8]}"
    ensure_user(name, tmp_path / "mallory-home")
    import pwd

    try:
        yield pwd.getpwnam(name).pw_uid
    finally:
        delete_user(name, tmp_path / "mallory-home")


def _tpuops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TPUOPS_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**env, "COLUMNS": "200"}, check=False,
    )  # fmt: skip


def _plant(folder: Path, uid: int, marker: Path) -> None:
    """Mallory's sops/job.yaml and tpuops.toml in `folder`, owned by mallory."""
    (folder / "sops").mkdir()
    (folder / "sops" / "job.yaml").write_text(ATTACK.format(marker=marker))
    (folder / "tpuops.toml").write_text('[params]\nrepo_url = "/home/mallory/theirs.git"\n')
    for p in (folder / "sops", folder / "sops" / "job.yaml", folder / "tpuops.toml"):
        os.chown(p, uid, uid)


def _git_init(path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(path)], check=True)


@pytest.mark.parametrize("shared", ["sticky", "theirs"])
@pytest.mark.parametrize("checkout", ["repo", "plain"])
def test_another_user_s_sops_and_settings_above_the_checkout_are_never_taken(
    tmp_path: Path, mallory: int, shared: str, checkout: str
) -> None:
    """A sticky world-writable folder (a shared /tmp) or a folder of mallory's holds mallory's job SOP and
    tpuops.toml; the victim (root) works in a folder of their own under it. A dry run with --offline plans the
    built-in job and runs nothing of mallory's."""
    top = tmp_path / "shared"
    top.mkdir()
    if shared == "sticky":
        top.chmod(0o1777)
    else:
        os.chown(top, mallory, mallory)
    marker = tmp_path / "mallory-was-here"
    _plant(top, mallory, marker)
    mine = top / "victim"
    mine.mkdir()
    if checkout == "repo":
        _git_init(mine)
    r = _tpuops(
        "run", "job", "--local", "--dry-run", "--offline", "--json", "--", "python", "-u", "t.py", cwd=mine
    )
    assert r.returncode == 0, r.stderr
    assert not marker.exists()  # neither the planted preflight nor its step ran
    listed = _tpuops("sop", "list", "--json", cwd=mine)
    job = next(row for row in json.loads(listed.stdout) if row["name"] == "job")
    assert job["origin"] == "built-in", job
    assert "/home/mallory/theirs.git" not in r.stdout + r.stderr


def test_the_walk_stops_at_the_repository_root(tmp_path: Path) -> None:
    """Folders above a checkout are not the project's, even the user's own."""
    (tmp_path / "sops").mkdir()
    (tmp_path / "sops" / "hello.yaml").write_text(
        "name: hello\nsteps:\n  - kind: shell\n    command: 'echo hi'\n"
    )
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    _git_init(repo)
    names = {row["name"] for row in json.loads(_tpuops("sop", "list", "--json", cwd=repo / "src").stdout)}
    assert "hello" not in names
    names = {row["name"] for row in json.loads(_tpuops("sop", "list", "--json", cwd=tmp_path).stdout)}
    assert "hello" in names  # the same folder, from where it is the nearest


@pytest.mark.parametrize("what", ["toml", "sops"])
def test_a_file_another_user_owns_or_everyone_can_write_is_refused_and_can_be_trusted_by_name(
    tmp_path: Path, mallory: int, what: str
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git_init(repo)
    marker = tmp_path / "ran"
    if what == "toml":
        (repo / "tpuops.toml").write_text('[params]\nsteps = "3"\n')
        os.chown(repo / "tpuops.toml", mallory, mallory)
        found = repo / "tpuops.toml"
    else:
        (repo / "sops").mkdir()
        (repo / "sops" / "hello.yaml").write_text(
            ATTACK.format(marker=marker).replace("name: job", "name: hello")
        )
        (repo / "sops").chmod(0o777)
        found = repo / "sops"
    r = _tpuops("sop", "list", cwd=repo)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip().splitlines()[0]
    why = "owned by tpuops-m" if what == "toml" else "writable by every user"
    assert line.startswith(f"error: {found}: {why}") and "only from files this user owns" in line, r.stderr
    assert ("--config PATH" if what == "toml" else "sops_dir") in r.stderr
    assert not marker.exists()
    if what == "toml":  # named by the user: taken
        named = _tpuops("--config", str(found), "sop", "list", "--json", cwd=repo)
        assert named.returncode == 0, named.stderr
