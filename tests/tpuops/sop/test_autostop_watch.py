"""The autostop watcher's idle rule (sop/autostop_watch.py) on this machine's own processes: a run lock whose holder
runs keeps the worker busy, a stale one (dead holder, reused pid, another boot, an old claim) does not; a job's pid
file without an exit file keeps it busy while the job runs. And the watcher itself against a metadata server and an
API on loopback: it acts once idle long enough, with the VM's token, holding the run lock meanwhile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tpuops.cloud.emulator.metadata import MetadataServer
from tpuops.sop import autostop_watch as watch


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"], process_group=0)
    yield proc
    proc.kill()
    proc.wait()


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _lock(home: Path, pid: int | None, *, start: str | None = None, boot: str | None = None) -> Path:
    lock = home / ".tpuops-run.lock"
    lock.mkdir()
    (lock / "run").write_text("r1\n")
    (lock / "boot").write_text((boot if boot is not None else watch.boot_id()) + "\n")
    if pid is not None:
        (lock / "start").write_text(f"{start if start is not None else _start_time(pid):<20}\n")
        (lock / "pid").write_text(f"{pid:<20}\n")
    return lock


def test_a_lock_whose_holder_runs_is_busy_and_a_free_worker_is_idle(
    tmp_path: Path, sleeper: subprocess.Popen
) -> None:
    now = time.time()
    assert watch.busy(tmp_path, ["~/tpuops/runs"], now) is None
    _lock(tmp_path, sleeper.pid)
    assert watch.busy(tmp_path, ["~/tpuops/runs"], now) == f"run r1 pid {sleeper.pid}"


@pytest.mark.parametrize("stale", ["dead holder", "pid reused", "another boot", "old claim"])
def test_a_stale_lock_is_idle(tmp_path: Path, sleeper: subprocess.Popen, stale: str) -> None:
    if stale == "dead holder":
        gone = subprocess.Popen(["true"])
        gone.wait()
        _lock(tmp_path, gone.pid, start="1")
    elif stale == "pid reused":  # the holder's pid, but another process's start time
        _lock(tmp_path, sleeper.pid, start=str(int(_start_time(sleeper.pid)) + 1))
    elif stale == "another boot":
        _lock(tmp_path, sleeper.pid, boot="00000000-0000-0000-0000-000000000000")
    else:  # claimed without a pid 60 s ago (its claimer died); a young one is being claimed
        lock = _lock(tmp_path, None)
        assert watch.busy(tmp_path, [], time.time()) == "run r1 claiming"
        os.utime(lock, (time.time() - 60, time.time() - 60))
    assert watch.busy(tmp_path, [], time.time()) is None


def test_a_job_without_an_exit_file_is_busy_while_it_runs(tmp_path: Path, sleeper: subprocess.Popen) -> None:
    rd = tmp_path / "tpuops" / "runs" / "job-1"
    rd.mkdir(parents=True)
    (rd / "worker-0.pid").write_text(f"{sleeper.pid:<20}\n")
    assert watch.busy(tmp_path, ["~/tpuops/runs"], time.time()) == f"job job-1 pid {sleeper.pid}"
    assert watch.busy(tmp_path, [str(tmp_path / "elsewhere")], time.time()) is None  # another runs folder
    (rd / "worker-0.exit").write_text("0\n")
    assert watch.busy(tmp_path, ["~/tpuops/runs"], time.time()) is None


def test_idle_time_counts_from_the_first_idle_poll_and_restarts_after_a_busy_one() -> None:
    idle = watch.Idle(20)
    assert idle.see(None, 100.0) == 120.0
    assert idle.see(None, 110.0) == 120.0
    assert idle.see("run r1 pid 7", 115.0) is None
    assert idle.see(None, 130.0) == 150.0


class _Api(BaseHTTPRequestHandler):
    calls: list[tuple[str, str, str]] = []

    def _any(self) -> None:
        _Api.calls.append((self.command, self.path, self.headers.get("Authorization", "")))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_POST = do_DELETE = _any

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_watcher_waits_for_the_run_to_end_then_acts_with_the_vms_token(
    tmp_path: Path, sleeper: subprocess.Popen
) -> None:
    md = MetadataServer()
    api = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    _Api.calls = []
    home, d = tmp_path / "home", tmp_path / "home" / ".tpuops-autostop"
    d.mkdir(parents=True)
    url = f"http://127.0.0.1:{api.server_address[1]}/v2/projects/p/locations/z/nodes/n:stop"
    (d / "config.json").write_text(json.dumps({"idle_s": 2, "action": "stop", "calls": [["POST", url]]}))
    _lock(home, sleeper.pid)
    env = {**os.environ, "HOME": str(home), "GCE_METADATA_HOST": md.host, "TPUOPS_AUTOSTOP_POLL_S": "0.2"}
    proc = subprocess.Popen([sys.executable, watch.__file__, str(d)], env=env)
    try:
        time.sleep(3)  # longer than idle_s: the run holds the lock all along
        assert _Api.calls == [] and proc.poll() is None
        assert md.guest[("tpuops", "autostop")] == f"busy run r1 pid {sleeper.pid}"
        second = subprocess.run([sys.executable, watch.__file__, str(d)], check=False, env=env, timeout=10)
        assert second.returncode == 0  # one watcher at a time: the second ends at once
        sleeper.kill()  # the run ends
        sleeper.wait()
        ended = time.monotonic()
        assert proc.wait(timeout=15) == 0
        assert time.monotonic() - ended >= 1.8  # idle for idle_s first
    finally:
        proc.kill()
        api.shutdown()
        md.close()
    assert _Api.calls == [
        ("POST", url.removeprefix(f"http://127.0.0.1:{api.server_address[1]}"), "Bearer emulator-token")
    ]
    assert md.guest[("tpuops", "autostop")] == "acting stop"
    assert (home / ".tpuops-run.lock" / "run").read_text() == "autostop\n"  # held while it acted
