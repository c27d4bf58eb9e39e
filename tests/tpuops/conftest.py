"""Fixtures that start the real parts: sshd servers on loopback (one per worker), a bare git remote."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tpuops.cloud.emulator.sshd import (
    WORKER_ENV,
    SshdWorker,
    client_keypair,
    remove_users,
    sshd_available,
    start_worker,
)
from tpuops.transport.base import Worker
from tpuops.transport.ssh import SshTransport

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def tpuops_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own tpuops state (known_hosts, runs, local scratch) and config-free cwd."""
    home = tmp_path / "tpuops-home"
    monkeypatch.setenv("TPUOPS_HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return home


@dataclass
class SshdPool:
    """Up to N running sshd workers shared by the session; `take(n)` hands out clean ones."""

    base: Path
    key: Path
    public: str
    workers: list[SshdWorker]

    def take(self, n: int) -> list[SshdWorker]:
        while len(self.workers) < n:
            k = len(self.workers)
            self.workers.append(start_worker(k, self.base / f"w{k}", self.public))
        chosen = self.workers[:n]
        for w in chosen:
            w.start()  # a test may have stopped it
            _clean(w)
        return chosen

    def transport(self, workers: list[SshdWorker], **kw: object) -> SshTransport:
        return SshTransport(
            [Worker(i, "127.0.0.1", w.port, w.user, w.fingerprint) for i, w in enumerate(workers)],
            known_hosts=Path(os.environ["TPUOPS_HOME"]) / "known_hosts",
            identity=self.key,
            **kw,
        )

    def host_args(self, workers: list[SshdWorker]) -> list[str]:
        args: list[str] = []
        for w in workers:
            args += ["--host", f"{w.user}@127.0.0.1:{w.port}", "--hostkey", w.fingerprint]
        return [*args, "--identity", str(self.key)]


def _clean(w: SshdWorker) -> None:
    """Stop the worker user's leftover processes and empty its home (keeping its authorized key).

    The user is this session's own: its name is unique to this process and leased (tpuops.cloud.emulator.
    sshd.start_worker), so every process it has was started by this session's tests.
    """
    if os.geteuid() != 0:
        return
    subprocess.run(["pkill", "-KILL", "-u", w.user], check=False, capture_output=True)
    for child in w.home.iterdir():
        if child.name != ".ssh":
            subprocess.run(["rm", "-rf", str(child)], check=True)
    # The test remote is a bare repo owned by root; on a VM it would be GitHub. Let git read it.
    (w.home / ".gitconfig").write_text("[safe]\n\tdirectory = *\n")


@pytest.fixture(scope="session")
def sshd_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdPool]:
    if not sshd_available():
        pytest.fail("Debian's openssh-server is required (the README's test command installs it)")
    base = tmp_path_factory.mktemp("sshd")
    base.chmod(0o755)
    key, public = client_keypair(base / "client")
    pool = SshdPool(base, key, public, [])
    yield pool
    remove_users(pool.workers)  # stops each sshd; deletes the users and homes this session created


@pytest.fixture
def git_remote(tmp_path: Path) -> tuple[Path, str]:
    """A bare repository with one commit on main, readable by every worker user: (path, first sha)."""
    src, bare = tmp_path / "src", Path("/tmp") / f"tpuops-remote-{os.getpid()}-{tmp_path.name}.git"
    subprocess.run(["rm", "-rf", str(bare)], check=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(src)], check=True)
    (src / "train.py").write_text("print('hello')\n")
    (src / ".gitignore").write_text(".env\n")
    subprocess.run([*git, "-C", str(src), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(src), "commit", "-qm", "first"], check=True)
    subprocess.run([*git, "clone", "-q", "--bare", str(src), str(bare)], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(bare)], check=True)
    sha = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    yield bare, sha.stdout.strip()
    subprocess.run(["rm", "-rf", str(bare)], check=True)


def commit_to(bare: Path, tmp: Path, name: str, content: str) -> str:
    """Push one more commit to the bare remote; returns its sha."""
    work = tmp / f"push-{name}"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "clone", "-q", str(bare), str(work)], check=True)
    (work / name).write_text(content)
    subprocess.run([*git, "-C", str(work), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", name], check=True)
    subprocess.run([*git, "-C", str(work), "push", "-q", "origin", "HEAD:main"], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(bare)], check=True)
    out = subprocess.run(
        ["git", "-C", str(work), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.fixture(scope="session")
def worker_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An interpreter the workers' own Unix users can run, with this environment's packages (jax, the trainer's).

    The environment is the running one: a venv (python -m venv, uv venv) or none. Its interpreter may live
    under /root (mode 0700), which the workers cannot enter: a hard-linked copy of the base prefix costs no disk
    and ~3 s, with the running environment's site-packages (the venv's, editable installs' .pth files and all)
    in place of the base's, as the venv itself sees them; a wrapper points the dynamic loader at the copy's
    libpython (its RPATH still names /root). Where the base is readable by everyone (a Debian /usr), a venv is
    copied alone (its python links to that base), and no venv at all is used as it is.
    """
    prefix, env = Path(sys.base_prefix), Path(sys.prefix)
    in_venv = env != prefix
    if os.geteuid() != 0 or (_everyone_can_enter(prefix) and (not in_venv or _everyone_can_enter(env))):
        yield sys.executable
        return
    copy = Path("/opt") / f"tpuops-test-python-{os.getpid()}"
    for left in copy.parent.glob("tpuops-test-python-*.trash-*"):  # an ended session's unfinished delete
        if not _alive(int(left.name.split("-")[3].split(".")[0])):  # a live session deletes its own
            _delete_in_background(left)
    if copy.exists():  # a crashed session that had this pid
        _discard(copy)
    if _everyone_can_enter(prefix):  # a venv over a readable base: the venv alone travels
        subprocess.run(["cp", "-al", str(env), str(copy)], check=True)
        yield str(copy / "bin" / "python")
        _discard(copy)
        return
    site = Path("lib") / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    _link_tree(prefix, copy, skip=site if in_venv else None)
    if in_venv:  # the venv's packages where the base's were; a venv that sees the base's too gets both
        if _venv_sees_system_packages(env):
            subprocess.run(["cp", "-al", str(prefix / site), str(copy / site)], check=True)
        (copy / site).mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-alf", f"{env / site}/.", str(copy / site)], check=True)
        # The venv's own programs beside the interpreter, where tools look for them (py-spy: logs/follow.py).
        tools = [str(f) for f in (env / "bin").iterdir() if f.is_file() and not f.is_symlink()]
        tools = [t for t in tools if not (copy / "bin" / Path(t).name).exists()]
        if tools:
            subprocess.run(["cp", "-al", *tools, str(copy / "bin")], check=True)
    exe = copy / "bin" / Path(sys.executable).name
    if not exe.exists():  # a venv's python3.11 link named after the base's python3
        exe = copy / "bin" / Path(os.path.realpath(sys.executable)).name
    wrapper = copy / "bin" / "python-for-workers"
    wrapper.write_text(f'#!/bin/sh\nLD_LIBRARY_PATH={copy}/lib exec {exe} "$@"\n')
    wrapper.chmod(0o755)
    # A venv made from the wrapper (a python_env step's) links to the copy's interpreter, not the wrapper: the
    # emulated workers' sessions get the loader's path too (its sshd passes the variables WORKER_ENV names).
    with pytest.MonkeyPatch.context() as env_patch:
        env_patch.setenv("LD_LIBRARY_PATH", f"{copy}/lib")
        names = os.environ.get(WORKER_ENV, "")
        env_patch.setenv(WORKER_ENV, f"{names},LD_LIBRARY_PATH" if names else "LD_LIBRARY_PATH")
        yield str(wrapper)
    _discard(copy)


def _everyone_can_enter(path: Path) -> bool:
    """Whether another Unix user can reach `path`: every folder on the way searchable by others."""
    for part in [path, *path.parents]:
        try:
            if not part.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _venv_sees_system_packages(env: Path) -> bool:
    cfg = env / "pyvenv.cfg"
    lines = cfg.read_text().splitlines() if cfg.exists() else []
    return any(ln.replace(" ", "").lower() == "include-system-site-packages=true" for ln in lines)


def _link_tree(src: Path, dest: Path, skip: Path | None) -> None:
    """`cp -al src dest`, leaving out the one folder `skip` (relative to src) and nothing else."""
    if skip is None:
        subprocess.run(["cp", "-al", str(src), str(dest)], check=True)
        return
    dest.mkdir()
    head, rest = skip.parts[0], Path(*skip.parts[1:]) if len(skip.parts) > 1 else None
    others = [str(child) for child in src.iterdir() if child.name != head]
    if others:
        subprocess.run(["cp", "-al", *others, str(dest)], check=True)
    inner = src / head
    if rest is not None and inner.is_dir() and not inner.is_symlink():
        _link_tree(inner, dest / head, rest)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _discard(folder: Path) -> None:
    """Move a folder out of the way at once (a rename) and delete it in the background.

    Deleting the ~93k links of the Python copy takes 4-46 s; pytest need not wait for it. The trash name is
    made unique by mkdtemp, so neither a later session (even one given the same pid) nor a delete still
    running can collide with it.
    """
    trash = Path(tempfile.mkdtemp(prefix=f"{folder.name}.trash-", dir=folder.parent))
    folder.rename(trash / folder.name)
    _delete_in_background(trash)


def _delete_in_background(path: Path) -> None:
    subprocess.Popen(
        ["nice", "-n", "19", "rm", "-rf", str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives pytest; nobody waits for it
    )
