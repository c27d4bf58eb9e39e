"""A run's life on real sshd workers: all or none, one run per VM under a lock, nothing changed by a refused
start, a full disk said as such, and local edits on a worker kept before a git sync discards them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.tpuops.conftest import SshdPool, commit_to
from tpuops.errors import ExitCode
from tpuops.run import finish, launch
from tpuops.sop.executor import Executor
from tpuops.sop.loader import Sop
from tpuops.transport.base import CmdResult, Kind
from tpuops.transport.ssh import SshTransport

LOCK = ".tpuops-run.lock"


def job(command: str, *, repo: str | None = None, follow: bool = False) -> Sop:
    """A SOP that (optionally) syncs a checkout, then starts `command` detached (and follows it)."""
    steps: list[dict] = []
    if repo:
        steps.append({"kind": "git_sync", "repo": repo, "ref": "main", "dir": "~/repo"})
    steps.append({"kind": "run", "command": command, "runs_dir": "~/runs"})
    if follow:
        steps.append({"kind": "follow", "runs_dir": "~/runs", "poll_s": 0.05, "timeout": 60})
    return Sop.model_validate({"name": "job", "steps": steps})


def alive(pid: int) -> bool:
    """Running and not a zombie (the workers are local users: their processes are in this /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def marked(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (a job of this test, on any worker)."""
    found = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in p.read_bytes() and alive(int(p.parent.name)):
                found.append(int(p.parent.name))
        except OSError:
            continue
    return found


def stand_ins(home: Path) -> list[int]:
    """Live stand-in holders of the run lock (`sleep 7200`) started as the worker that owns `home`."""
    uid = home.stat().st_uid
    found = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if p.read_bytes() == b"sleep\x007200\x00" and p.parent.stat().st_uid == uid:
                found.append(int(p.parent.name))
        except OSError:
            continue
    return [pid for pid in found if alive(pid)]


def wait_until(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def run_step(report: launch.SopReport):
    return next(s for s in report.steps if s.kind == "run")


def test_a_start_that_fails_on_one_worker_stops_what_it_started_on_the_others(sshd_pool: SshdPool) -> None:
    """Worker 0's runs dir is unwritable: worker 1's job, already started, is stopped by its pid and the report
    says so per worker; no process of the job and no run lock is left anywhere."""
    workers = sshd_pool.take(2)
    t = sshd_pool.transport(workers)
    marker = f"lifecycle-{os.getpid()}-{time.monotonic_ns()}"
    try:
        t.run(0, "mkdir -p ~/runs && chmod 0555 ~/runs")
        report = Executor(t).execute(job(f"sleep 60; : {marker}"), {}, "half", [0, 1])
        step = run_step(report)
        w0, w1 = step.outcomes[0], step.outcomes[1]
        assert w0.status == "failed" and "Permission denied" in w0.detail, w0
        assert w1.status == "cancelled", w1
        pid = w1.data["pid"]
        assert w1.detail == f"started pid {pid}, then stopped: the start failed on w0"
        assert report.first_failure()[1] == 0  # the cause is named, not the worker stopped for it
        assert finish.judge(None, steps=report).code == ExitCode.FAILED
        assert not alive(int(pid)) and not marked(marker)
        assert (workers[1].home / "runs/half/worker-1.exit").read_text().split() == ["143", "stopped"]
        assert not any((w.home / LOCK).exists() for w in workers)
    finally:
        t.run(0, "chmod 0755 ~/runs")
        t.close()


class _LostStartReply(SshTransport):
    """Real sshd workers; worker 0's start really runs (its job starts, its pid file is written), and its answer
    is lost on the way back, as a dropped connection loses it (the transport's own reading of a closed channel
    is tested in tests/tpuops/test_faults.py)."""

    def run(self, worker: int, command: str, **kw: Any) -> CmdResult:
        r = super().run(worker, command, **kw)
        if worker == 0 and "setsid nohup sh -c" in command:
            return CmdResult(worker, r.command, 255, error="connection lost", kind=Kind.CONNECT)
        return r


def test_a_start_whose_answer_is_lost_after_its_job_started_stops_that_job_too(sshd_pool: SshdPool) -> None:
    """Worker 0's start ends without its answer, though its job did start: the executor cannot know the job
    runs, so it looks, finds it by the pid file, and stops it with worker 1's. Nothing of the run is left on
    either worker: no job, no lock, no stand-in."""
    workers = sshd_pool.take(2)
    base = sshd_pool.transport(workers)
    t = _LostStartReply(base.workers, known_hosts=base.known_hosts, identity=base.identity)
    marker = f"lifecycle-{os.getpid()}-{time.monotonic_ns()}"
    try:
        report = Executor(t).execute(job(f"sleep 60; : {marker}"), {}, "lost", [0, 1])
        step = run_step(report)
        w0, w1 = step.outcomes[0], step.outcomes[1]
        assert w0.status == "failed", w0
        assert w0.detail.startswith("connection lost; its job had started (pid "), w0
        assert w0.detail.endswith(") and was stopped"), w0
        assert w1.status == "cancelled" and w1.detail.endswith("then stopped: the start failed on w0"), w1
        assert not marked(marker)
        for k, w in enumerate(workers):
            assert (w.home / f"runs/lost/worker-{k}.exit").read_text().split() == ["143", "stopped"]
            assert not (w.home / LOCK).exists() and not stand_ins(w.home)
    finally:
        t.close()


def test_full_disk_before_the_start_starts_nothing_and_says_so(sshd_pool: SshdPool) -> None:
    """A write to worker 0's pid file fails with ENOSPC (it is /dev/full, as on a full disk): nothing runs on
    either worker, the report says "no space left on device", the lock is given back."""
    workers = sshd_pool.take(2)
    t = sshd_pool.transport(workers)
    marker = f"lifecycle-{os.getpid()}-{time.monotonic_ns()}"
    try:
        t.run(0, "mkdir -p ~/runs/full && ln -s /dev/full ~/runs/full/worker-0.pid")
        report = Executor(t).execute(job(f"sleep 60; : {marker}"), {}, "full", [0, 1])
        step = run_step(report)
        assert step.outcomes[0].status == "failed"
        assert step.outcomes[0].detail == "no space left on device for the run's files: nothing was started"
        assert step.outcomes[1].status == "cancelled"  # started, then stopped: all or none
        assert finish.judge(None, steps=report).code == ExitCode.FAILED
        assert not marked(marker)
        assert not any((w.home / LOCK).exists() for w in workers)
    finally:
        t.close()


def test_a_disk_that_fills_during_the_run_is_reported_as_such_with_the_exit_code(sshd_pool: SshdPool) -> None:
    """The disk fills after the start (the pid and exit files were reserved before it): the job's writes fail
    with ENOSPC, and so does the wrapper's probe of the disk at the end (both go to /dev/full, which fails
    every write with ENOSPC as a full disk does). The exit code still lands, and the follow says no space
    left on device, not "killed or preempted"."""
    (w,) = sshd_pool.take(1)
    t = sshd_pool.transport([w])
    try:
        t.run(0, "mkdir -p ~/runs/filled && ln -s /dev/full ~/runs/filled/worker-0.space")
        command = "exec > /dev/full 2>&1; echo step=0 || true"  # every line the job prints is lost
        report = Executor(t).execute(job(command, follow=True), {}, "filled", [0])
        follow = report.steps[-1].outcomes[0]
        assert follow.status == "failed", follow
        assert (
            follow.detail == "job exited 0; no space left on device on the worker (its log may be cut short)"
        )
        assert follow.data["exit_code"] == 0
        assert (w.home / "runs/filled/worker-0.exit").read_text().split() == ["0", "nospace"]
        assert not (w.home / LOCK).exists()
        assert stand_ins(w.home) == []  # the job ended before the start handed it the lock: no holder is left
    finally:
        t.close()


def snapshot(home: Path) -> dict[str, str]:
    """Every path under a worker's home (but .ssh) with its type, mode and content digest."""
    out = {}
    for p in sorted(home.rglob("*")):
        rel = str(p.relative_to(home))
        if rel == ".ssh" or rel.startswith(".ssh/"):
            continue
        st = p.lstat()
        if p.is_symlink():
            out[rel] = f"link {p.readlink()}"
        elif p.is_dir():
            out[rel] = f"dir {st.st_mode:o}"
        else:
            out[rel] = f"file {st.st_mode:o} {hashlib.sha256(p.read_bytes()).hexdigest()}"
    return out


def test_a_refused_start_changes_nothing_on_either_worker(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    """Run A runs; run B (another commit, another .env, a stale TPU lock to clear) is refused with exit 4, and
    both workers are byte for byte as they were: checkout, .git, .env, runs, locks."""
    workers = sshd_pool.take(2)
    bare, _ = git_remote
    (tmp_path / ".env").write_text("TOKEN=first-value\n")
    sop = Sop.model_validate(
        {
            "name": "prepared",
            "params": {"branch": {"type": "str", "default": "main"}},
            "steps": [
                {"kind": "git_sync", "repo": str(bare), "ref": "{branch}", "dir": "~/repo"},
                {"kind": "python_env", "repo_dir": "~/repo", "venv": "none", "python": "python3"},
                {"kind": "clear_lockfile", "lockfile": "~/libtpu_lockfile"},
                {"kind": "sync_env", "dest": "~/repo/.env"},
                {"kind": "run", "command": "sleep 600", "cwd": "~/repo", "runs_dir": "~/runs"},
            ],
        }
    )
    t = sshd_pool.transport(workers)
    try:
        first = Executor(t, local_dir=tmp_path).execute(sop, {"branch": "main"}, "run-a", [0, 1])
        assert first.ok, first.first_failure()
        new = commit_to(bare, tmp_path, "b.py", "b = 2\n")
        (tmp_path / ".env").write_text("TOKEN=second-value\n")
        for w in workers:
            (w.home / "libtpu_lockfile").write_text("")  # a stale TPU lock the refused run must not clear
            (w.home / "repo" / "notes.txt").write_text("typed on the VM\n")
        before = [snapshot(w.home) for w in workers]
        second = Executor(t, local_dir=tmp_path).execute(sop, {"branch": new}, "run-b", [0, 1])
        assert finish.judge(None, steps=second).code == ExitCode.TPU_BUSY
        assert [s.title for s in second.steps] == ["run lock"]
        pid = first.steps[-1].outcomes[0].data["pid"]
        assert second.steps[0].outcomes[0].detail == (
            f"run run-a (pid {pid}) is active on this worker (use --force to stop it)"
        )
        assert [snapshot(w.home) for w in workers] == before
    finally:
        for k in range(2):
            t.run(
                k,
                'kill -KILL -"$(tr -dc 0-9 < ~/runs/run-a/worker-$0.pid)" 2>/dev/null; true'.replace(
                    "$0", str(k)
                ),
            )
        t.close()


@pytest.mark.slow
def test_two_runs_started_at_the_same_moment_never_both_start(
    sshd_pool: SshdPool, git_remote: tuple[Path, str]
) -> None:
    """20 times: two runs (git sync, then a short job) started at once on the same 2 workers. Exactly one
    starts, on both workers; the other is refused at the lock and leaves nothing (no run dir, no stash)."""
    workers = sshd_pool.take(2)
    sop = job("sleep 0.3", repo=str(git_remote[0]))
    transports = [sshd_pool.transport(workers), sshd_pool.transport(workers)]
    try:
        for i in range(20):
            ids = [f"race{i}-a", f"race{i}-b"]
            reports: dict[int, launch.SopReport] = {}
            gate = threading.Barrier(2)

            def one(
                k: int, ids: list[str] = ids, reports: dict = reports, gate: threading.Barrier = gate
            ) -> None:
                gate.wait()
                reports[k] = Executor(transports[k]).execute(sop, {}, ids[k], [0, 1])

            threads = [threading.Thread(target=one, args=(k,)) for k in range(2)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(timeout=60)
            started = [k for k in range(2) if reports[k].ok]
            assert len(started) == 1, [r.steps for r in reports.values()]
            (won,) = started
            lost = 1 - won
            assert {o.status for o in run_step(reports[won]).outcomes.values()} == {"changed"}
            assert finish.judge(None, steps=reports[lost]).code == ExitCode.TPU_BUSY
            assert all(s.kind == "lock" for s in reports[lost].steps)  # refused before any step ran
            for w in workers:
                assert not (w.home / "runs" / ids[lost]).exists()
                assert not (w.home / "tpuops" / "stash").exists()
            for k, w in enumerate(workers):  # the winner's job ends and gives the lock back by itself
                done = w.home / "runs" / ids[won] / f"worker-{k}.exit"
                wait_until(done.exists)
                wait_until(lambda lock=w.home / LOCK: not lock.exists())
    finally:
        for t in transports:
            t.close()


def test_git_sync_names_and_stashes_local_edits_before_the_reset(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    (w,) = sshd_pool.take(1)
    bare, _ = git_remote
    sop = Sop.model_validate(
        {"name": "s", "steps": [{"kind": "git_sync", "repo": str(bare), "ref": "main", "dir": "~/repo"}]}
    )
    t = sshd_pool.transport([w])
    try:
        assert Executor(t).execute(sop, {}, "sync-1", [0]).ok
        (w.home / "repo" / "train.py").write_text("print('edited on the VM')\n")
        (w.home / "repo" / "notes.txt").write_text("typed on the VM\n")
        # A dry run reads (never writes) the same list first: the CLI's --dry-run, --json, and --offline.
        before = _tree(w.home)
        (sop_file := tmp_path / "s.yaml").write_text(json.dumps(sop.model_dump(exclude_none=True)))
        argv = [
            sys.executable,
            "-m",
            "tpuops",
            "sop",
            "run",
            str(sop_file),
            *sshd_pool.host_args([w]),
            "--dry-run",
        ]
        dry = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
        assert dry.returncode == 0, dry.stderr
        assert dry.stderr.splitlines()[-1] == (
            "w0 git_sync: would discard (copied to the stash first): M train.py, ?? notes.txt"
        ), dry.stderr
        as_json = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=120, check=False)
        assert json.loads(as_json.stdout)["preview"] == [{
            "step": "git_sync", "worker": 0, "says": "would discard (copied to the stash first)",
            "found": [" M train.py", "?? notes.txt"], "error": None,
        }]  # fmt: skip
        offline = subprocess.run(
            [*argv, "--offline", "--json"], capture_output=True, text=True, timeout=120, check=False
        )
        assert json.loads(offline.stdout)["preview"] == [] and offline.returncode == 0
        assert _tree(w.home) == before  # read, not written: no stash, no fetch, no file touched
        report = Executor(t).execute(sop, {}, "sync-2", [0])
        outcome = report.steps[0].outcomes[0]
        assert outcome.status == "changed"
        assert outcome.data["discarded"] == [" M train.py", "?? notes.txt"]
        stash = Path(str(outcome.data["stash"]))
        assert stash.parent == w.home / "tpuops" / "stash" and stash.name.endswith("-sync-2")
        assert (
            f"local changes stashed to {stash} before the reset: M train.py, ?? notes.txt" in outcome.detail
        )
        assert (stash / "files" / "train.py").read_text() == "print('edited on the VM')\n"
        assert (stash / "files" / "notes.txt").read_text() == "typed on the VM\n"
        assert "+print('edited on the VM')" in (stash / "tracked.patch").read_text()
        assert (w.home / "repo" / "train.py").read_text() == "print('hello')\n"  # the reset still happened
        assert not (w.home / "repo" / "notes.txt").exists()
        again = Executor(t).execute(sop, {}, "sync-3", [0]).steps[0].outcomes[0]
        assert again.status == "nothing" and "discarded" not in again.data  # a clean checkout: nothing named
        clean = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
        assert clean.stderr.splitlines()[-1] == "w0 git_sync: no local changes to discard", clean.stderr
    finally:
        t.close()


def _tree(home: Path) -> dict[str, tuple[int, str]]:
    """Every file under a worker's home with its mtime and content hash (git's own index refresh excepted)."""
    return {
        str(p.relative_to(home)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(home.rglob("*"))
        if p.is_file() and p.name != "index"
    }


def test_a_job_that_ends_at_once_leaves_no_holder_of_the_lock(tmp_path: Path) -> None:
    """A job may end (and give the lock back) before its start hands it the lock: the claim's stand-in holder
    is stopped all the same. Ten quick jobs on the local transport, then no stand-in of theirs is left."""
    from tpuops.transport.local import LocalTransport

    t = LocalTransport(tmp_path / "vm")
    for i in range(10):
        report = Executor(t).execute(job("true", follow=True), {}, f"quick-{i}", [0])
        assert report.ok, report.first_failure()
        wait_until(lambda: not (t.home(0) / LOCK).exists())  # given back just after the exit file
    home = str(t.home(0)).encode()
    left = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if (
                p.read_bytes() == b"sleep\x007200\x00"
                and b"HOME=" + home + b"\x00" in (p.parent / "environ").read_bytes()
            ):
                left.append(int(p.parent.name))
        except OSError:
            continue
    assert [pid for pid in left if alive(pid)] == []
    wait_until(lambda: not (t.home(0) / LOCK).exists())  # the last job gives it back just after its exit file
