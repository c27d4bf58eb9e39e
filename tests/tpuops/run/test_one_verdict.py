"""One verdict per run, wherever it is read (run/finish.judge): a run followed to its end, the same run detached
(its client killed) and attached again, and `tpuops report RUN_ID` after the fact give the same exit code and the
same fix, on a real sshd worker; attach watches for a hang as the run's own follow does."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tpuops.conftest import SshdPool
from tpuops.errors import ExitCode

pytestmark = pytest.mark.slow

OOM = "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB."
FIX = "find a batch that fits: tpuops fit CONFIG --accelerator TYPE"
SOP = """name: {name}
params:
  delay: {{type: float, default: 0}}
scan: {{source: log, warmup: 1{scan}}}
steps:
  - kind: run
    command: "{command}"
    runs_dir: ~/runs
  - kind: follow
    runs_dir: ~/runs
    poll_s: 0.1
    timeout: 120
    hang_factor: {hang_factor}
    hang_min_s: 2
  - kind: fetch_log
    runs_dir: ~/runs
"""
JOBS = {
    # An out-of-memory after two steps: exit 10, and the fix names `tpuops fit`.
    "oom": (f"echo step=0 dt=0.1s; sleep {{delay}}; echo step=1 dt=0.1s; echo '{OOM}'; false", "", 0),
    # A recompile check's job that compiles after the warm-up: exit 7.
    "recompile": (
        "echo 'Compiling f with global shapes'; echo step=0 dt=0.1s; sleep {delay}; "
        "echo 'Compiling f with global shapes'; echo step=1 dt=0.1s; echo step=2 dt=0.1s",
        ", fail_on_recompile: true",
        0,
    ),
}


def run_cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _sop(tmp_path: Path, kind: str, hang_factor: float | None = None) -> Path:
    command, scan, factor = JOBS.get(kind, ("", "", 0))
    if kind == "hang":  # steps, then a job that makes no more progress (and would run on for minutes)
        command = "echo step=0 dt=0.1s; echo step=1 dt=0.1s; echo step=2 dt=0.1s; sleep 300"
    path = tmp_path / f"{kind}.yaml"
    path.write_text(SOP.format(name=kind, scan=scan, command=command, hang_factor=hang_factor or factor))
    return path


def newest_run(cwd: Path) -> str:
    return str(json.loads(run_cli("runs", "--json", "--offline", cwd=cwd).stdout)[0]["run_id"])


def lose_client(args: list[str], cwd: Path, worker_home: Path, jobs: int = 1) -> None:
    """Start `tpuops ARGS` and kill its client (the laptop goes away) once the worker holds `jobs` runs' jobs:
    the job runs on, detached, for `tpuops attach` to follow."""
    client = subprocess.Popen(
        [sys.executable, "-m", "tpuops", *args],
        cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list((worker_home / "runs").glob("*/worker-0.pid"))) < jobs:
            assert time.monotonic() < deadline, f"job {jobs} never started"
            time.sleep(0.05)
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()


def _ended(worker_home: Path, run_id: str, timeout: float = 60) -> None:
    exit_file = worker_home / "runs" / run_id / "worker-0.exit"
    deadline = time.monotonic() + timeout
    while not exit_file.exists():
        assert time.monotonic() < deadline, f"no {exit_file}: " + "; ".join(
            f"{f.name}: {f.read_text()[-300:]!r}" for f in exit_file.parent.glob("*") if f.is_file()
        )
        time.sleep(0.1)


@pytest.mark.parametrize(("kind", "code"), [("oom", ExitCode.OOM), ("recompile", ExitCode.RECOMPILE)])
def test_a_run_followed_attached_or_reported_gets_one_verdict(
    sshd_pool: SshdPool, tmp_path: Path, kind: str, code: ExitCode
) -> None:
    (w,) = sshd_pool.take(1)
    hosts = sshd_pool.host_args([w])
    followed = run_cli("sop", "run", str(_sop(tmp_path, kind)), *hosts, cwd=tmp_path)
    assert followed.returncode == code, followed.stderr[-3000:]

    # The same run, its client killed once its job runs (the laptop goes away), then attached again.
    lose_client(
        ["sop", "run", str(_sop(tmp_path, kind)), *hosts, "--set", "delay=3"], tmp_path, w.home, jobs=2
    )
    run_id = newest_run(tmp_path)
    _ended(w.home, run_id)
    attached = run_cli("attach", run_id, cwd=tmp_path)
    reported = run_cli("report", run_id, cwd=tmp_path)
    for r in (attached, reported):
        assert r.returncode == code, r.stderr[-3000:]
    if kind == "oom":  # the same fix every way it is read
        for r in (followed, attached, reported):
            assert FIX in r.stderr, r.stderr[-2000:]


def test_attach_watches_a_hang_as_the_run_s_own_follow_does(sshd_pool: SshdPool, tmp_path: Path) -> None:
    (w,) = sshd_pool.take(1)
    hosts = sshd_pool.host_args([w])
    sop = _sop(tmp_path, "hang", hang_factor=2)
    lose_client(["sop", "run", str(sop), *hosts], tmp_path, w.home)
    run_id = newest_run(tmp_path)
    t0 = time.monotonic()
    attached = run_cli("attach", run_id, cwd=tmp_path)
    assert attached.returncode == ExitCode.HANG, attached.stderr[-3000:]
    assert time.monotonic() - t0 < 60  # not the job's 300 s: the run's own hang bound (min 2 s here)
    stop = run_cli("stop", run_id, cwd=tmp_path)
    assert stop.returncode == 0, stop.stderr
    assert not [p for p in Path("/proc").glob("[0-9]*") if _is(p, b"sleep\x00300\x00", w.home)]


def _is(proc: Path, cmdline: bytes, home: Path) -> bool:
    try:
        return (proc / "cmdline").read_bytes() == cmdline and proc.stat().st_uid == home.stat().st_uid
    except OSError:
        return False


def test_the_verdict_of_a_log_names_the_cause_as_a_followed_run_does(tmp_path: Path) -> None:
    """finish.judge on a log alone: an out-of-memory 10 with its fix, a held TPU 4, a recompile 7 only where the
    run fails on it, a hang 9, a lost worker never ok."""
    from tpuops.logs.scanner import LogScanner
    from tpuops.run import finish

    def log(*lines: str):
        s = LogScanner(warmup=1)
        for ln in lines:
            s.feed(ln)
        return s.close()

    oom = finish.judge(log("step=0 dt=0.1s", OOM), config="tiny", accelerator="v6e-8")
    assert (
        oom.code == ExitCode.OOM
        and oom.hint is not None
        and "tpuops fit tiny --accelerator v6e-8" in oom.hint
    )
    busy = finish.judge(log("step=0 dt=0.1s", "RuntimeError: TPU is already in use by process 12"))
    assert busy.code == ExitCode.TPU_BUSY
    recompiled = log("Compiling f with global shapes", "step=0 dt=0.1s", "step=1 dt=0.1s",
                     "Compiling f with global shapes", "step=2 dt=0.1s")  # fmt: skip
    assert finish.judge(recompiled).code == ExitCode.OK
    assert finish.judge(recompiled, fail_on_recompile=True).code == ExitCode.RECOMPILE
    assert finish.judge(log("step=0 dt=0.1s"), hung=True).code == ExitCode.HANG
    assert finish.judge(log("step=0 dt=0.1s"), lost=True).code == ExitCode.FAILED
