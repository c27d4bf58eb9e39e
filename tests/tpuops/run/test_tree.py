"""The working tree as it travels: the uncommitted change as one patch made without touching the user's index or
files, applied to a clean checkout of the same commit gives the same files; one home per repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tpuops.errors import UsageError
from tpuops.run import tree

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


def _repo(path: Path) -> Path:
    subprocess.run([*GIT, "init", "-q", str(path)], check=True)
    (path / "train.py").write_text("print('v1')\n")
    (path / "old name.py").write_text("x = 1\n")
    (path / "gone.py").write_text("y = 2\n")
    (path / ".gitignore").write_text("out/\n.env\n")
    subprocess.run([*GIT, "-C", str(path), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(path), "commit", "-qm", "base"], check=True)
    return path


def _state(repo: Path) -> tuple[bytes, bytes, bytes]:
    """What the user sees and git keeps: status, the index file, the stash list."""
    status = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain=v1", "-uall"], capture_output=True, check=True
    )
    stash = subprocess.run(["git", "-C", str(repo), "stash", "list"], capture_output=True, check=True)
    return status.stdout, (repo / ".git" / "index").read_bytes(), stash.stdout


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def test_a_patch_of_every_kind_of_change_rebuilds_the_tree_and_leaves_the_user_s_checkout_as_it_was(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path / "mine")
    (repo / "train.py").write_text("print('v2: the edit')\n")  # modified
    (repo / "gone.py").unlink()  # deleted
    subprocess.run(
        ["git", "-C", str(repo), "mv", "old name.py", "new näme.py"], check=True
    )  # renamed, staged
    (repo / "data file ü.txt").write_text("spaces and unicode\n")  # untracked
    (repo / "blob.bin").write_bytes(bytes(range(256)) * 4)  # binary, untracked
    (repo / "out").mkdir()
    (repo / "out" / "ignored.txt").write_text("git ignores this\n")  # ignored: does not travel
    before = _state(repo)

    change = tree.change(repo)

    assert change is not None and _state(repo) == before  # status, index and stash byte for byte
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    assert change.base == head.stdout.strip()
    assert "M train.py" in change.status and "D gone.py" in change.status
    assert "?? data file ü.txt" in change.status and "?? blob.bin" in change.status
    assert any(s.startswith("R old name.py -> new näme.py") for s in change.status), change.status
    assert change.summary().startswith("uncommitted: ") and change.digest in change.summary()
    # A clean clone at the base commit plus the patch has exactly the user's files (the ignored one aside).
    clone = tmp_path / "worker"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "apply", "--binary", "-"], input=change.patch, check=True)
    mine = {k: v for k, v in _files(repo).items() if not k.startswith("out/")}
    assert _files(clone) == mine


def test_a_clean_tree_has_no_change_and_a_change_over_the_limit_or_under_sync_commit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repo(tmp_path / "mine")
    assert tree.change(repo) is None
    (repo / "out").mkdir()
    (repo / "out" / "big.bin").write_bytes(b"0" * 1000)  # ignored: still no change
    assert tree.change(repo) is None
    (repo / "train.py").write_text("print('v2')\n")
    (repo / "extra.txt").write_text("new\n")
    change = tree.change(repo)
    assert change is not None
    with pytest.raises(UsageError, match=r"sync=commit .* M train\.py, \?\? extra\.txt"):
        tree.check(change, "commit")
    tree.check(change, "tree")
    monkeypatch.setattr(tree, "PATCH_LIMIT", len(change.patch) - 1)
    with pytest.raises(UsageError, match=r"the uncommitted change is .* \(limit .*\): M train\.py"):
        tree.check(change, "tree")


def test_outside_a_checkout_there_is_nothing_to_send(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="git rev-parse"):
        tree.change(tmp_path)
    assert tree.take({"patch": None}, {"repo_url": "x", "branch": "y"}, set(), tmp_path) is None


def test_one_home_per_repository_whatever_its_url_spelling_and_two_for_two_forks() -> None:
    same = {
        tree.repo_home(u)
        for u in (
            "https://github.com/acme/train.git",
            "git@github.com:acme/train.git",
            "ssh://git@github.com:22/acme/train",
            "https://someone@github.com/acme/train/",
        )
    }
    assert len(same) == 1 and next(iter(same)).startswith("~/tpuops/train-")
    assert tree.repo_home("git@github.com:fork/train.git") not in same
    assert tree.repo_home("/srv/git/train.git") != tree.repo_home("/srv/other/train.git")
