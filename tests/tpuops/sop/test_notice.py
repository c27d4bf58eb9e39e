"""The preemption-notice watcher in the `run` step's real start script (run by sh here), against a real metadata
server on loopback (the emulator's): a notice, a maintenance event, a migration, an unreachable or wrong server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest

from tpuops.cloud.emulator.metadata import MetadataServer
from tpuops.cloud.emulator.sshd import free_port
from tpuops.logs.events import NOTICE, exit_status
from tpuops.sop.actions import Command
from tpuops.sop.model import PlanContext
from tpuops.sop.runs import Run

# A job as a training loop writes one: a step every 0.1 s; SIGTERM is noted and honoured at the next step boundary
# (exit 143 after a "checkpoint"); with `poll`, the notice file is looked at instead. 100 steps (10 s) at most.
JOB = """
import os, signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append("SIGTERM"))
notice = os.environ.get("TPUOPS_NOTICE_FILE", "")
print("notice file:", notice or "none", flush=True)
for step in range(int(sys.argv[1])):
    time.sleep(0.1)
    print(f"step={step}", flush=True)
    if sys.argv[2] == "poll" and notice and os.path.exists(notice):
        stop.append("file")
    if stop:
        print(f"checkpoint step={step + 1}; stopped by {stop[0]}", flush=True)
        sys.exit(143)
"""


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    md = MetadataServer()
    yield md
    md.close()


def _start(tmp_path: Path, host: str, mode: str, *, steps: int = 100, poll: bool = False) -> Path:
    """The run step's start script for worker 0 in `tmp_path` (its own HOME: the run lock lives there); the job
    started detached as on a worker. Returns the run directory."""
    (tmp_path / "job.py").write_text(JOB)
    step = Run(
        command=f"{sys.executable} {tmp_path / 'job.py'} {steps} {'poll' if poll else 'signal'}",
        runs_dir=str(tmp_path / "runs"),
        preemption_notice=mode,
    )
    (cmd,) = step.plan(PlanContext(0, 1, "r1", {}))
    assert isinstance(cmd, Command)
    env = {**os.environ, "HOME": str(tmp_path), "GCE_METADATA_HOST": host}
    started = subprocess.run(
        ["sh", "-c", cmd.script], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert started.returncode == 0 and "tpuops: started pid=" in started.stdout, started.stderr
    return tmp_path / "runs" / "r1"


def _ended(rd: Path, timeout: float = 30) -> tuple[int | None, tuple[str, ...]]:
    deadline = time.monotonic() + timeout
    while not (rd / "worker-0.exit").exists():
        assert time.monotonic() < deadline, (rd / "worker-0.log").read_text()
        time.sleep(0.05)
    return exit_status((rd / "worker-0.exit").read_text())


def _after_step(rd: Path, n: int) -> None:
    deadline = time.monotonic() + 20
    while f"step={n}\n" not in (rd / "worker-0.log").read_text():
        assert time.monotonic() < deadline, (rd / "worker-0.log").read_text()
        time.sleep(0.02)


def _no_watcher_left(rd: Path) -> None:
    """The watcher ends with its job: no process still runs the run directory's watcher."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert str(rd / "notice-watch.py") not in out


def test_a_preemption_notice_writes_the_file_then_the_job_stops_at_its_step_boundary(
    tmp_path: Path, metadata: MetadataServer
) -> None:
    rd = _start(tmp_path, metadata.host, "signal")
    _after_step(rd, 3)
    metadata.set("preempted", "TRUE")
    assert _ended(rd) == (143, (NOTICE,))  # the job's shell survived to write the code and its note
    log = (rd / "worker-0.log").read_text()
    assert f"notice file: {rd}/worker-0.notice" in log and "stopped by SIGTERM" in log
    assert log.count("step=") < 40  # stopped well before its 100 steps
    assert (rd / "worker-0.notice").read_text() == "instance/preempted=TRUE\n"
    assert "instance/preempted=TRUE: wrote" in (rd / "worker-0.notice.log").read_text()
    _no_watcher_left(rd)


def test_a_maintenance_event_that_terminates_is_a_notice_and_a_migration_is_not(
    tmp_path: Path, metadata: MetadataServer
) -> None:
    rd = _start(tmp_path, metadata.host, "signal")
    _after_step(rd, 1)
    metadata.set("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")  # live migration: the VM stays
    _after_step(rd, 8)
    assert not (rd / "worker-0.exit").exists() and not (rd / "worker-0.notice").exists()
    metadata.set("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    assert _ended(rd) == (143, (NOTICE,))
    assert (
        rd / "worker-0.notice"
    ).read_text() == "instance/maintenance-event=TERMINATE_ON_HOST_MAINTENANCE\n"


def test_in_file_mode_only_the_file_says_it_and_the_job_decides(
    tmp_path: Path, metadata: MetadataServer
) -> None:
    rd = _start(tmp_path, metadata.host, "file", poll=True)
    _after_step(rd, 2)
    metadata.set("preempted", "TRUE")
    assert _ended(rd) == (143, (NOTICE,))
    assert "stopped by file" in (rd / "worker-0.log").read_text()  # no SIGTERM came


def _not_metadata() -> tuple[ThreadingHTTPServer, str]:
    """An HTTP server that is no metadata server: every path 404, no Metadata-Flavor header."""

    class Nope(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Nope)
    Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("server", ["unreachable", "not-metadata"])
def test_a_metadata_server_that_cannot_answer_never_disturbs_the_job(tmp_path: Path, server: str) -> None:
    http, host = _not_metadata() if server == "not-metadata" else (None, f"127.0.0.1:{free_port()}")
    try:
        rd = _start(tmp_path, host, "signal", steps=15)
        assert _ended(rd) == (0, ())  # all its steps, its own exit code, no note
    finally:
        if http is not None:
            http.shutdown()
            http.server_close()
    assert "step=14\n" in (rd / "worker-0.log").read_text()
    assert not (rd / "worker-0.notice").exists()
    assert "(retrying; the job goes on)" in (rd / "worker-0.notice.log").read_text()
    _no_watcher_left(rd)


def test_off_starts_no_watcher_and_a_bad_mode_is_refused(tmp_path: Path) -> None:
    rd = _start(tmp_path, "127.0.0.1:9", "off", steps=2)
    assert _ended(rd) == (0, ())
    assert "notice file: none" in (rd / "worker-0.log").read_text()
    assert not (rd / "notice-watch.py").exists() and not (rd / "worker-0.notice.log").exists()
    with pytest.raises(
        ValueError, match="preemption_notice must be one of signal, file, off, received 'yes'"
    ):
        Run(command="true", preemption_notice="yes").plan(PlanContext(0, 1, "r1", {}))


def test_the_emulated_metadata_server_answers_as_compute_engine_does(metadata: MetadataServer) -> None:
    url = f"http://{metadata.host}/computeMetadata/v1/instance/preempted"

    def get(suffix: str = "", flavor: bool = True) -> tuple[str, str]:
        req = urllib.request.Request(url + suffix, headers={"Metadata-Flavor": "Google"} if flavor else {})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read().decode(), r.headers["ETag"]

    with pytest.raises(urllib.error.HTTPError, match="403"):
        get(flavor=False)
    value, tag = get()
    assert value == "FALSE"
    t0 = time.monotonic()
    assert get(f"?wait_for_change=true&timeout_sec=1&last_etag={tag}") == (value, tag)  # unchanged: after 1 s
    assert time.monotonic() - t0 >= 0.9
    Thread(target=lambda: (time.sleep(0.3), metadata.set("preempted", "TRUE")), daemon=True).start()
    changed, new_tag = get(f"?wait_for_change=true&timeout_sec=30&last_etag={tag}")
    assert changed == "TRUE" and new_tag != tag
    assert get(f"?wait_for_change=true&last_etag={tag}")[0] == "TRUE"  # already changed: at once
