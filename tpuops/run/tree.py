"""The user's working tree as it travels to the workers: the pushed base commit plus the uncommitted change as
one binary patch (tracked edits, deletions, renames and untracked files git does not ignore), and each
repository's own home on a worker (its checkout and its environment)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from tpuops.config import private_dir, state_home
from tpuops.errors import UsageError

# The largest uncommitted change a run sends (the patch, binary files base85-encoded as git writes them). Larger
# ones are data or build output: commit them, ignore them, or put them where the job reads data from.
PATCH_LIMIT = 10 * 1024 * 1024


@dataclass(frozen=True)
class TreeChange:
    """What the working tree has beyond its HEAD commit."""

    base: str  # the commit the patch applies to
    patch: bytes  # `git diff --binary` of HEAD against the tree as it is
    status: tuple[str, ...]  # `git status --porcelain` entries: "M train.py", "?? extra.txt", "R a -> b"

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.patch).hexdigest()[:12]

    def files(self) -> str:
        shown = ", ".join(self.status[:8])
        return shown + (f", and {len(self.status) - 8} more" if len(self.status) > 8 else "")

    def summary(self) -> str:
        return (
            f"uncommitted: {self.files()} ({_size(len(self.patch))}), patch {self.digest} on {self.base[:7]}"
        )


def _size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MB"


def _git(top: Path, *args: str, env: dict[str, str] | None = None) -> bytes:
    r = subprocess.run(["git", *args], cwd=top, capture_output=True, env=env, check=False, timeout=120)
    if r.returncode != 0:
        raise UsageError(
            f"git {args[0]} in {top}: {r.stderr.decode(errors='replace').strip() or r.returncode}"
        )
    return r.stdout


def _status(top: Path) -> tuple[str, ...]:
    """`git status --porcelain -z` read-only (no optional index refresh: the user's index is never written)."""
    raw = _git(top, "--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=all").decode(
        errors="surrogateescape"
    )
    entries, parts, i = [], raw.split("\0"), 0
    while i < len(parts):
        item = parts[i]
        i += 1
        if len(item) < 4:
            continue
        xy, path = item[:2], item[3:]
        if "R" in xy or "C" in xy:  # a rename's origin follows as its own entry
            path = f"{parts[i]} -> {path}"
            i += 1
        entries.append(f"{xy.strip()} {path}")
    return tuple(entries)


def change(cwd: Path) -> TreeChange | None:
    """The checkout's uncommitted change, or None when its tree is its HEAD. Made in a throwaway index
    (GIT_INDEX_FILE), so the user's index, stash and files stay exactly as they were."""
    top = Path(_git(cwd, "rev-parse", "--show-toplevel").decode().strip())
    status = _status(top)
    if not status:
        return None
    base = _git(top, "rev-parse", "HEAD").decode().strip()
    with tempfile.TemporaryDirectory(prefix="tpuops-tree-") as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        _git(top, "read-tree", "HEAD", env=env)
        _git(top, "add", "--all", "--", ".", env=env)  # as the user's .gitignore says
        patch = _git(
            top,
            "diff",
            "--cached",
            "--binary",
            "--full-index",
            "--no-color",
            "--no-ext-diff",
            "HEAD",
            env=env,
        )
    if not patch:
        return None
    return TreeChange(base, patch, status)


def save(tree: TreeChange) -> Path:
    """The patch kept under the state home by its hash (0600): what the run sends and its folder keeps."""
    folder = private_dir(state_home() / "patches")
    path = folder / f"{tree.digest}.patch"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, tree.patch)
        finally:
            os.close(fd)
    return path


def check(tree: TreeChange, sync: str) -> None:
    """The change travels (`sync=tree`, under PATCH_LIMIT) or the run is refused, naming the files."""
    if sync == "commit":
        raise UsageError(
            f"sync=commit runs the pushed commit only, and this checkout has {tree.files()}",
            hint="commit and push them, or leave out sync=commit to run the tree as it is",
        )
    if len(tree.patch) > PATCH_LIMIT:
        raise UsageError(
            f"the uncommitted change is {_size(len(tree.patch))} (limit {_size(PATCH_LIMIT)}): {tree.files()}",
            hint="commit and push it, add what is data or output to .gitignore, or pass --set sync=commit",
        )


_SCP = re.compile(r"^(?:[\w.-]+@)?([\w.-]+):(?!//)(.+)$")  # git@github.com:owner/repo.git


def canonical_url(url: str) -> str:
    """One spelling per repository: https, ssh and scp-style URLs of one repository agree (host and path,
    without user, port, scheme or .git); a local path is absolute."""
    u = url.strip()
    if m := _SCP.match(u):
        host, path = m.group(1), m.group(2)
    elif "://" in u:
        rest = u.split("://", 1)[1]
        where, _, path = rest.partition("/")
        host = where.rsplit("@", 1)[-1].split(":", 1)[0]
    else:
        host, path = "", str(Path(u).expanduser().absolute())
    path = path.strip("/").removesuffix(".git").rstrip("/")
    return f"{host.lower()}/{path}" if host else "/" + path


def repo_home(url: str) -> str:
    """`~/tpuops/<name>-<hash>`: where one repository's checkout and environment live on a worker, so two
    repositories (or the bundled trainer and a user's project) never share either."""
    canon = canonical_url(url)
    name = re.sub(r"[^A-Za-z0-9._-]", "-", canon.rsplit("/", 1)[-1]) or "repo"
    return f"~/tpuops/{name[:40]}-{hashlib.sha256(canon.encode()).hexdigest()[:8]}"


def take(params: Collection[str], values: dict[str, object], given: set[str], cwd: Path) -> str | None:
    """sync=tree (the default): this checkout's uncommitted change becomes the SOP's `patch`, and one line says
    what travels; sync=commit refuses a dirty tree. Only where the run syncs this very checkout at its HEAD
    (repo_url and branch not given, no patch of the user's own)."""
    if "patch" not in params or {"patch", "repo_url", "branch"} & given or not values.get("repo_url"):
        return None
    try:
        tree = change(cwd)
    except UsageError:  # not a git checkout: the repository comes from elsewhere
        return None
    if tree is None or tree.base != values.get("branch"):
        return None
    check(tree, str(values.get("sync") or "tree"))
    values["patch"] = str(save(tree))
    return tree.summary()


def keep(run_folder: Path, values: dict[str, object]) -> None:
    """The run's folder keeps the change it ran (`tree.patch`, on top of the recorded commit `branch`)."""
    patch = values.get("patch")
    if patch:
        private_dir(run_folder)
        target = run_folder / "tree.patch"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, Path(str(patch)).expanduser().read_bytes())
        finally:
            os.close(fd)
