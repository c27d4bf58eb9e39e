"""Nothing of a run outlives it, on real sshd workers: `tpuops stop` during a slow prepare step stops that step
and nothing starts after it (exit 14); Ctrl-C during it leaves nothing running and says what it stopped; a client
killed with SIGKILL leaves its step to `tpuops stop` or to a later run's `--force`; a stale lock (its pid now
another process's) is taken over without touching that process."""

from __future__ import annotations

import json
import os
import pwd
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tpuops.conftest import SshdPool
from tests.tpuops.sop.test_lifecycle import LOCK, alive, wait_until
from tpuops.errors import ExitCode

pytestmark = pytest.mark.slow

SLOW = """name: slow
steps:
  - kind: shell
    name: slow sync
    command: "sleep {prep}"
  - kind: run
    name: start
    command: "sleep {job}"
    runs_dir: ~/runs
"""


def _sop(tmp_path: Path) -> tuple[Path, str, str]:
    """A SOP whose prepare step sleeps (a git sync that takes long) before its job: each sleep is told apart
    from any other process on the machine by its odd duration."""
    n = random.randrange(10_000, 99_999)
    prep, job = f"300.{n}", f"400.{n}"
    path = tmp_path / "slow.yaml"
    path.write_text(SLOW.format(prep=prep, job=job))
    return path, prep, job


def sleeps(seconds: str) -> list[int]:
    """Live `sleep SECONDS` processes (the sleep itself, not a shell whose script names it)."""
    want = f"sleep\0{seconds}\0".encode()
    found = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if p.read_bytes() == want and alive(int(p.parent.name)):
                found.append(int(p.parent.name))
        except OSError:
            continue
    return found


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _start(sop: Path, pool: SshdPool, workers: list, cwd: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tpuops", "sop", "run", str(sop), *pool.host_args(workers), "--json", *extra],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _run_id(cwd: Path) -> str:
    runs = json.loads(_cli("runs", "--json", "--offline", cwd=cwd).stdout)
    return runs[0]["run_id"]


def test_stop_during_a_slow_prepare_step_stops_it_and_nothing_starts_after(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    workers = sshd_pool.take(2)
    sop, prep, job = _sop(tmp_path)
    client = _start(sop, sshd_pool, workers, tmp_path)
    try:
        wait_until(lambda: len(sleeps(prep)) == 2)  # the step runs on both workers
        stop = _cli("stop", _run_id(tmp_path), "--json", cwd=tmp_path)
        assert stop.returncode == 0, stop.stderr
        said = json.loads(stop.stdout)["workers"]
        for w in said.values():
            assert "stopped step slow sync" in w["detail"] and "run lock released" in w["detail"], w
        assert sleeps(prep) == []
        out, err = client.communicate(timeout=60)
    finally:
        client.kill()
    assert client.returncode == ExitCode.STOPPED, err
    data = json.loads(out)
    assert (
        data["error_class"] == "stopped" if "error_class" in data else data["exit_code"] == ExitCode.STOPPED
    )
    time.sleep(0.5)
    assert sleeps(job) == []  # the job never started, on either worker
    for w in workers:
        assert not (w.home / "runs").exists() or not list((w.home / "runs").rglob("*.pid"))
        assert not (w.home / LOCK).exists()


def test_ctrl_c_during_a_slow_prepare_step_leaves_nothing_running_and_says_what_it_stopped(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    workers = sshd_pool.take(2)
    sop, prep, _ = _sop(tmp_path)
    client = _start(sop, sshd_pool, workers, tmp_path)
    try:
        wait_until(lambda: len(sleeps(prep)) == 2)
        client.send_signal(signal.SIGINT)
        _, err = client.communicate(timeout=60)
    finally:
        client.kill()
    assert "interrupted before the job started: stopped step slow sync" in err and "w0, w1" in err, err
    assert sleeps(prep) == []
    for w in workers:
        assert not (w.home / LOCK).exists()


def test_a_killed_client_s_step_is_stopped_by_a_later_forced_run_before_it_changes_anything(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    (w,) = sshd_pool.take(1)
    sop, prep, job = _sop(tmp_path)
    client = _start(sop, sshd_pool, [w], tmp_path)
    wait_until(lambda: len(sleeps(prep)) == 1)
    client.kill()  # SIGKILL: no clean-up of its own
    client.wait()
    assert len(sleeps(prep)) == 1  # still running on the worker: the lock says whose it is
    refused = _cli("sop", "run", str(sop), *sshd_pool.host_args([w]), cwd=tmp_path)
    assert refused.returncode == ExitCode.TPU_BUSY, refused.stderr
    other = tmp_path / "other.yaml"  # a quick SOP: forced, it stops the leftovers first
    other.write_text("name: other\nsteps:\n  - kind: run\n    command: 'true'\n    runs_dir: ~/runs\n")
    forced = _cli("sop", "run", str(other), *sshd_pool.host_args([w]), "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert sleeps(prep) == [] and sleeps(job) == []


def test_a_stale_lock_whose_pid_is_now_another_process_is_taken_over_without_touching_it(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    (w,) = sshd_pool.take(1)
    n = random.randrange(10_000, 99_999)
    # An unrelated process of the same user, and a lock (left by a run before a reboot) naming its pid with
    # another start time: the kernel gave that pid to someone else since.
    other = subprocess.Popen(["su", "-s", "/bin/sh", w.user, "-c", f"exec sleep 500.{n}"])
    try:
        uid = pwd.getpwnam(w.user).pw_uid
        wait_until(lambda: len(sleeps(f"500.{n}")) == 1)  # the sleep itself, not su above it
        (pid,) = sleeps(f"500.{n}")
        assert Path(f"/proc/{pid}").stat().st_uid == uid
        lock = w.home / LOCK
        lock.mkdir()
        (lock / "run").write_text("20250101-000000-old-0000\n")
        (lock / "pid").write_text(f"{pid}\n")
        (lock / "start").write_text("1\n")  # not this process's start time
        subprocess.run(["chown", "-R", w.user, str(lock)], check=True)
        for force in ([], ["--force"]):
            sop = tmp_path / "quick.yaml"
            sop.write_text("name: quick\nsteps:\n  - kind: run\n    command: 'true'\n    runs_dir: ~/runs\n")
            r = _cli("sop", "run", str(sop), *sshd_pool.host_args([w]), "--json", *force, cwd=tmp_path)
            assert r.returncode == 0, r.stderr
            assert alive(pid), "the process that reused the lock's pid was stopped"
            if not force:
                lock_step = json.loads(r.stdout)["steps"][0]
                assert "pid now belongs to another process" in lock_step["workers"]["0"]["detail"], lock_step
                lock.mkdir()  # the same stale lock again, for the forced run
                (lock / "run").write_text("20250101-000000-old-0000\n")
                (lock / "pid").write_text(f"{pid}\n")
                (lock / "start").write_text("1\n")
                subprocess.run(["chown", "-R", w.user, str(lock)], check=True)
    finally:
        other.kill()
        for p in sleeps(f"500.{n}"):
            os.kill(p, signal.SIGKILL)
