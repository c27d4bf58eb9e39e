"""Ctrl-C detaches: following stops at once, the job goes on, `attach` resumes; `runs` says each run's state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tpuops.conftest import SshdPool


def _start(pool: SshdPool, workers: list, remote: Path, cwd: Path, steps: int) -> subprocess.Popen:
    args = [sys.executable, "-m", "tpuops", "sop", "run", "smoke", *pool.host_args(workers)]
    sets = {"repo_url": str(remote), "steps": str(steps), "step_seconds": "0.1", "lockfile": "~/l"}
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_steps(proc: subprocess.Popen, n: int) -> list[str]:
    assert proc.stderr is not None
    shown: list[str] = []
    seen: list[str] = []
    deadline = time.monotonic() + 90
    while len(shown) < n and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:  # the run ended before its step lines: say how
            break
        seen.append(line)
        if line.startswith("[w0] step="):
            shown.append(line.strip().split("] ", 1)[1])
    assert len(shown) == n, (shown, proc.poll(), "".join(seen[-30:]))
    return shown


def _wait_for_the_lock(workers: list) -> None:
    """A finished job gives its workers' run lock back just after its exit file says it ended: a start in
    between is refused (a run is active), so the next start waits for the lock."""
    lock = [w.home / ".tpuops-run.lock" for w in workers]
    deadline = time.monotonic() + 30
    while any(p.exists() for p in lock) and time.monotonic() < deadline:
        time.sleep(0.1)


def _tpuops(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _states(cwd: Path) -> dict[str, dict]:
    out = _tpuops(cwd, "runs", "--json")
    assert out.returncode == 0, out.stderr
    return {r["run_id"]: r for r in json.loads(out.stdout)}


@pytest.mark.slow
def test_ctrl_c_detaches_attach_resumes_and_runs_says_each_state(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    workers = sshd_pool.take(2)
    bare = git_remote[0]
    # 1. Ctrl-C while following: stops within 2 s with one line naming attach and stop; exit 130.
    first = _start(sshd_pool, workers, bare, tmp_path, steps=100)
    shown = _wait_for_steps(first, 5)
    t0 = time.monotonic()
    first.send_signal(signal.SIGINT)
    code = first.wait(timeout=30)
    took = time.monotonic() - t0
    rest = first.stderr.read()
    assert code == 130, rest
    assert took < 2.0, took
    shown += [ln.split("] ", 1)[1] for ln in rest.splitlines() if ln.startswith("[w0] step=")]
    (line,) = [ln for ln in rest.splitlines() if "detached:" in ln]
    ((run_id, state),) = _states(tmp_path).items()
    assert state["status"] == "running"  # asked of the workers: the job goes on
    assert line == (
        f"tpuops: detached: run {run_id} is still running on the workers; "
        f"follow it again with `tpuops attach {run_id}`, stop it with `tpuops stop {run_id}`"
    )
    # Ctrl-C during `attach` detaches again, with the same line: the job goes on.
    env = {**os.environ, "COLUMNS": "200"}
    attaching = subprocess.Popen([sys.executable, "-m", "tpuops", "attach", run_id], cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    shown += _wait_for_steps(attaching, 2)
    t0 = time.monotonic()
    attaching.send_signal(signal.SIGINT)
    assert attaching.wait(timeout=30) == 130
    assert time.monotonic() - t0 < 2.0
    rest = attaching.stderr.read() if attaching.stderr else ""
    shown += [ln.split("] ", 1)[1] for ln in rest.splitlines() if ln.startswith("[w0] step=")]
    assert [ln for ln in rest.splitlines() if "detached:" in ln] == [line], rest
    assert _states(tmp_path)[run_id]["status"] == "running"
    # `attach` resumes where the follow stopped: every line once.
    attached = _tpuops(tmp_path, "attach", run_id)
    assert attached.returncode == 0, attached.stderr
    again = [ln.split("] ", 1)[1] for ln in attached.stderr.splitlines() if ln.startswith("[w0] step=")]
    every = [f"step={i} loss=0.000000 entropy=0.0000 reward_mean=0.0000 dt=0.1s" for i in range(100)]
    assert shown + again == every and again
    assert _states(tmp_path)[run_id]["status"] == "ok"

    # 2. The client goes away (SIGKILL) and the job finishes: `runs` asks the workers: exited 0.
    _wait_for_the_lock(workers)
    second = _start(sshd_pool, workers, bare, tmp_path, steps=8)
    _wait_for_steps(second, 1)
    second.send_signal(signal.SIGKILL)
    second.wait()
    (gone,) = set(_states(tmp_path)) - {run_id}
    _wait_for_the_lock(workers)  # the job gives the lock back when it ends
    assert _states(tmp_path)[gone]["status"] == "exited 0"

    # 3. Detached, then stopped: `runs` says stopped (and so do the workers' exit files).
    third = _start(sshd_pool, workers, bare, tmp_path, steps=400)
    _wait_for_steps(third, 2)
    third.send_signal(signal.SIGINT)
    assert third.wait(timeout=30) == 130
    (stopped,) = set(_states(tmp_path)) - {run_id, gone}
    assert _states(tmp_path)[stopped]["status"] == "running"
    stop = _tpuops(tmp_path, "stop", stopped)
    assert stop.returncode == 0, stop.stderr
    assert _states(tmp_path)[stopped]["status"] == "stopped"
    for k, w in enumerate(workers):
        exit_file = w.home / "tpuops" / "runs" / stopped / f"worker-{k}.exit"
        assert exit_file.read_text().split() == ["143", "stopped"]
        assert not (w.home / ".tpuops-run.lock").exists()
