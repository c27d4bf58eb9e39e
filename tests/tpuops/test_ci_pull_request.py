"""CI on `pull_request` (docs/ci.md): the checkout is a merge commit only refs/pull/N/merge reaches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tpuops.conftest import SshdPool

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


@pytest.fixture
def pr_remote(tmp_path: Path) -> tuple[str, str, str]:
    """A bare remote served over file:// with main and a merge commit only under refs/pull/7/merge:
    (url, main's sha, the merge commit's sha)."""
    src, bare = tmp_path / "src", Path("/tmp") / f"tpuops-pr-{os.getpid()}-{tmp_path.name}.git"
    subprocess.run(["rm", "-rf", str(bare)], check=True)
    subprocess.run([*GIT, "init", "-q", str(src)], check=True)
    (src / "train.py").write_text("print('main')\n")
    subprocess.run([*GIT, "-C", str(src), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(src), "commit", "-qm", "main"], check=True)
    main = _sha(src, "HEAD")
    (src / "train.py").write_text("print('pull request 7')\n")
    subprocess.run([*GIT, "-C", str(src), "commit", "-qam", "merge of pull request 7"], check=True)
    merge = _sha(src, "HEAD")
    subprocess.run([*GIT, "-C", str(src), "update-ref", "refs/pull/7/merge", merge], check=True)
    subprocess.run([*GIT, "-C", str(src), "reset", "-q", "--hard", main], check=True)
    subprocess.run([*GIT, "init", "-q", "--bare", str(bare)], check=True)
    subprocess.run([*GIT, "-C", str(src), "push", "-q", str(bare), "main", "refs/pull/7/merge"], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(bare)], check=True)
    yield f"file://{bare}", main, merge
    subprocess.run(["rm", "-rf", str(bare)], check=True)


def _sha(repo: Path, rev: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", rev], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_pull_request_checkout_syncs_its_merge_commit_to_the_workers(
    sshd_pool: SshdPool, pr_remote: tuple[str, str, str], tmp_path: Path
) -> None:
    url, _main, merge = pr_remote
    # What actions/checkout does on pull_request: fetch the merge ref into refs/remotes/pull/7/merge, detach.
    work = tmp_path / "checkout"
    subprocess.run([*GIT, "init", "-q", str(work)], check=True)
    subprocess.run([*GIT, "-C", str(work), "remote", "add", "origin", url], check=True)
    subprocess.run([*GIT, "-C", str(work), "fetch", "-q", "--depth=1", "origin",
                    f"+{merge}:refs/remotes/pull/7/merge"], check=True)  # fmt: skip
    subprocess.run(
        [*GIT, "-C", str(work), "checkout", "-q", "--detach", "refs/remotes/pull/7/merge"], check=True
    )
    workers = sshd_pool.take(2)
    r = subprocess.run(
        [sys.executable, "-m", "tpuops", "sop", "run", "sync", *sshd_pool.host_args(workers),
         "--set", "lockfile=~/libtpu_lockfile", "--set", "repo_dir=~/pr-repo", "--json"],
        cwd=work, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(r.stdout)
    assert [data["steps"][0]["workers"][str(w)]["detail"] for w in (0, 1)] == [f"at {merge[:7]}"] * 2
    for w in workers:
        assert (w.home / "pr-repo" / "train.py").read_text() == "print('pull request 7')\n"
    # The ref CI names works as well, and a commit the remote does not have is still one clear line.
    for ref, says in (("refs/pull/7/merge", f"at {merge[:7]}"), ("0" * 40, "unknown branch or commit")):
        r = subprocess.run(
            [sys.executable, "-m", "tpuops", "sop", "run", "sync", *sshd_pool.host_args(workers[:1]),
             "--set", "lockfile=~/libtpu_lockfile", "--set", "repo_dir=~/pr-repo", "--set", f"branch={ref}",
             "--json"],
            cwd=work, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
        assert says in json.loads(r.stdout)["steps"][0]["workers"]["0"]["detail"], r.stdout
