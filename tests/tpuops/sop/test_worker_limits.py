"""What a worker cannot take, on real sshd workers: a command past the one-argument limit of its shell is refused
before anything changes; a disk that fills while a git sync stashes the worker's edits is its own failure."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tpuops.conftest import SshdPool
from tpuops import shell
from tpuops.errors import ExitCode
from tpuops.sop.executor import Executor
from tpuops.sop.loader import Sop


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "tpuops", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=cwd)


def _tree(root: Path) -> dict[str, str]:
    """Every file and folder under `root` with its content hash (git's index, which reads refresh, excepted)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
        if p.name != "index" and not p.is_symlink()
    }


def test_the_longest_command_a_worker_takes_is_max_command_bytes(sshd_pool: SshdPool) -> None:
    """The limit tpuops checks against is the worker's: sshd hands a command to the login shell as one argument,
    and Linux takes one of at most 131,071 bytes (MAX_ARG_STRLEN, its NUL included). One byte more fails."""
    (w,) = sshd_pool.take(1)
    t = sshd_pool.transport([w])
    try:
        room = shell.MAX_COMMAND_BYTES - shell.command_bytes(": ; echo fits")
        longest = ": " + "x" * room + "; echo fits"
        assert shell.command_bytes(longest) == shell.MAX_COMMAND_BYTES
        fits = t.run(0, longest)
        assert fits.ok and fits.stdout == "fits\n", fits
        past = t.run(0, longest.replace(": ", ": x", 1))
        assert not past.ok and "Argument list too long" in past.stderr, past
    finally:
        t.close()


@pytest.mark.parametrize("kb", [140, 300])
def test_a_command_too_long_for_the_workers_is_refused_before_anything_changes(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path, kb: int
) -> None:
    """`-- CMD` of 140 KB (past the shell's argument limit) and 300 KB (past OpenSSH's packet too): exit 2 naming
    the size and the limit, before any worker is asked anything: the checkout keeps its edits, no lock, no run."""
    (w,) = sshd_pool.take(1)
    bare, _ = git_remote
    sop = {
        "name": "long",
        "params": {"cmd": {"type": "list"}},
        "steps": [
            {"kind": "git_sync", "repo": str(bare), "ref": "main", "dir": "~/repo"},
            {"kind": "run", "command": "{cmd}", "runs_dir": "~/runs"},
        ],
    }
    t = sshd_pool.transport([w])
    try:
        assert Executor(t).execute(Sop.model_validate({**sop, "steps": sop["steps"][:1]}), {}, "sync", [0]).ok
    finally:
        t.close()
    (w.home / "repo" / "train.py").write_text("print('edited on the VM')\n")
    before = _tree(w.home)
    (sop_file := tmp_path / "long.yaml").write_text(json.dumps(sop))
    words = ["abcdefghi"] * (kb * 100)  # 10 bytes a word with its space
    r = _cli(["sop", "run", str(sop_file), *sshd_pool.host_args([w]), "--", "echo", *words], tmp_path)
    assert r.returncode == ExitCode.USAGE, r.stderr[-2000:]
    (line,) = r.stderr.strip().splitlines()
    size = int(line.split("its command is ")[1].split(" bytes")[0].replace(",", ""))
    assert kb * 1000 < size < kb * 1000 + 8000, line
    limit = shell.MAX_COMMAND_BYTES - 1024
    assert f"over the {limit:,} a step may send to a worker" in line, line
    assert "at most 131,071 bytes" in line and "nothing was run" in line, line
    assert _tree(w.home) == before  # the checkout not reset, no run folder, no lock


def _worktree(repo: Path) -> dict[str, str]:
    """A checkout's files (.git aside: the sync's fetch before the stash writes FETCH_HEAD) and its HEAD."""
    git = ["git", "-c", "safe.directory=*", "-C", str(repo)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=False, capture_output=True, text=True)
    files = {k: v for k, v in _tree(repo).items() if not (k == ".git" or k.startswith(".git/"))}
    assert head.returncode == 0, head.stderr
    return {**files, "HEAD": head.stdout.strip()}


def _mount_tmpfs(at: Path, size: str, user: str) -> None:
    """A small filesystem of its own under a worker's home (tmpfs: fills for real, leaves nothing on disk)."""
    at.mkdir()
    pw = pwd.getpwnam(user)
    opts = f"size={size},uid={pw.pw_uid},gid={pw.pw_gid},mode=0755"
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "tpuops-test", str(at)],
        check=False,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.fail(f"this test mounts a small tmpfs (root with CAP_SYS_ADMIN): {r.stderr.strip()}")


def _free(at: Path) -> int:
    st = os.statvfs(at)
    return st.f_bavail * st.f_frsize


def test_a_full_disk_while_stashing_edits_is_named_the_stash_removed_and_the_checkout_kept(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    """The worker's ~/tpuops is an 8 MiB filesystem, its checkout holds 3 MiB of edits and 256 KiB are free: the
    stash runs out of space. The run says so (the path, the bytes free), exits 15 (`resource`), removes the partial
    stash (the free space is back) and does not reset the checkout: every edit is where it was."""
    (w,) = sshd_pool.take(1)
    bare, _ = git_remote
    disk = w.home / "tpuops"
    _mount_tmpfs(disk, "8m", w.user)
    sop = {"name": "sync", "steps": [{"kind": "git_sync", "repo": str(bare), "ref": "main"}]}  # ~/tpuops/repo
    t = sshd_pool.transport([w])
    try:
        assert Executor(t).execute(Sop.model_validate(sop), {}, "sync-1", [0]).ok
        edit = "echo 'print(1)' >> ~/tpuops/repo/train.py; head -c 3145728 /dev/urandom > ~/tpuops/repo/notes.bin"
        assert t.run(0, edit).ok
        fill = f"fallocate -l {_free(disk) - (256 << 10)} ~/tpuops/fill"  # the rest of the disk, but 256 KiB
        assert t.run(0, fill).ok, "could not fill the test's filesystem"
        before = _worktree(disk / "repo")
        (sop_file := tmp_path / "sync.yaml").write_text(json.dumps(sop))
        r = _cli(["sop", "run", str(sop_file), *sshd_pool.host_args([w]), "--json"], tmp_path)
        assert r.returncode == ExitCode.RESOURCE, r.stderr[-2000:]
        out = json.loads(r.stdout)
        assert out["error_class"] == "resource" and out["failure"]["worker"] == 0, out
        free = _free(disk)
        stash = disk / "stash"
        detail = out["failure"]["detail"]
        assert detail.startswith(f"no space left on device stashing the local edits to {stash}/"), detail
        assert f"({free:,} bytes free; the local edits take " in detail, (detail, free)
        assert "the partial stash was removed and the checkout was not reset" in detail, detail
        assert list(stash.iterdir()) == []  # nothing half-written is left to keep the disk full
        assert free >= 200 << 10  # what the stash had taken is free again
        assert _worktree(disk / "repo") == before  # not reset, not cleaned: every edit is still there
        assert "print(1)" in (disk / "repo" / "train.py").read_text()
    finally:
        t.close()
        subprocess.run(["pkill", "-KILL", "-u", w.user], check=False, capture_output=True)
        subprocess.run(["umount", str(disk)], check=False, capture_output=True)
