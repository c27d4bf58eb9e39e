"""A run `tpuops stop` ended says `stopped` (exit 14) every way it is read: report, attach, runs, --json."""

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
from tpuops.errors import ExitCode
from tpuops.logs.events import LogReport
from tpuops.run import finish
from tpuops.sop.executor import SopReport, StepReport
from tpuops.sop.model import Outcome


def _tpuops(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
        check=False, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _detached_run(pool: SshdPool, workers: list, remote: Path, cwd: Path) -> str:
    """A smoke run on two workers, followed until its second step line, then detached (Ctrl-C): its run id."""
    args = [sys.executable, "-m", "tpuops", "sop", "run", "smoke", *pool.host_args(workers)]
    sets = {"repo_url": str(remote), "steps": "400", "step_seconds": "0.1", "lockfile": "~/l"}
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    deadline, steps = time.monotonic() + 90, 0
    while steps < 2 and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        steps += line.startswith("[w0] step=")
    assert steps == 2, proc.poll()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    (record,) = json.loads(_tpuops(cwd, "runs", "--json", "--offline").stdout)
    return str(record["run_id"])


@pytest.mark.slow
def test_a_stopped_run_says_stopped_in_report_attach_and_runs(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    workers = sshd_pool.take(2)
    run_id = _detached_run(sshd_pool, workers, git_remote[0], tmp_path)
    local = Path(os.environ["TPUOPS_HOME"]) / "runs" / run_id
    assert not list(local.glob("worker-*.log"))  # detached before its end: nothing fetched yet
    stop = _tpuops(tmp_path, "stop", run_id)
    assert stop.returncode == 0, stop.stderr
    # `report RUN_ID` before any attach: the logs are fetched from the workers, and the verdict is stopped.
    reported = _tpuops(tmp_path, "report", run_id)
    assert reported.returncode == ExitCode.STOPPED == 14, reported.stderr
    assert f"fetched the logs of w0, w1 of run {run_id} from its workers" in reported.stderr
    assert "stopped (exit code 14)" in reported.stderr and "failed" not in reported.stderr
    for k in (0, 1):
        assert (local / f"worker-{k}.exit").read_text().split() == ["143", "stopped"]
    as_json = _tpuops(tmp_path, "report", run_id, "--json")
    data = json.loads(as_json.stdout)
    assert as_json.returncode == 14 and data["error_class"] == "stopped" and data["exit_code"] == 14
    assert data["report"]["exit_codes"] == {"0": 143, "1": 143}  # the jobs' own codes stay what they were
    # attach: the same verdict, in words and in JSON.
    attached = _tpuops(tmp_path, "attach", run_id)
    assert attached.returncode == 14, attached.stderr
    assert "stopped (exit code 14)" in attached.stderr and "failed (exit code" not in attached.stderr
    attached_json = json.loads(_tpuops(tmp_path, "attach", run_id, "--json").stdout)
    assert (attached_json["exit_code"], attached_json["error_class"]) == (14, "stopped")
    # runs: stopped, from the saved result (offline) and as --json.
    (row,) = json.loads(_tpuops(tmp_path, "runs", "--json", "--offline").stdout)
    assert row["status"] == "stopped"
    assert json.loads((local / "result.json").read_text())["exit_code"] == 14


def _log(exit_codes: dict[int, int | None], failed: bool = True) -> LogReport:
    from tpuops.logs.events import apply_exit

    log = LogReport(workers=sorted(exit_codes))
    for w, c in exit_codes.items():
        apply_exit(log, w, c)
    assert log.failed is failed
    return log


def test_the_verdict_of_a_stopped_run_is_stopped_unless_a_worker_failed_before() -> None:
    stopped = finish.judge(_log({0: 143, 1: 143}), stopped={0, 1})
    assert (stopped.code, stopped.words, stopped.stopped) == (ExitCode.STOPPED, "stopped", (0, 1))
    # One worker had ended well before the stop: still a stop.
    assert finish.judge(_log({0: 0, 1: 143}), stopped={1}).code == ExitCode.STOPPED
    # One worker had failed on its own (exit 1) before the other was stopped: a failure, as before.
    failed = finish.judge(_log({0: 1, 1: 143}), stopped={1})
    assert (failed.code, failed.words) == (ExitCode.FAILED, "failed")
    # A worker with no exit file (killed, preempted) is no stop either.
    assert finish.judge(_log({0: None, 1: 143}), stopped={1}).code == ExitCode.FAILED
    # Nothing stopped: the log's own rule (a job that exited 143 by itself is a failure).
    assert finish.judge(_log({0: 143, 1: 143})).code == ExitCode.FAILED
    assert finish.judge(_log({0: 0}, failed=False)).code == ExitCode.OK
    assert finish.judge(_log({0: 0}, failed=False), lost=True).code == ExitCode.FAILED


def test_a_followed_run_whose_job_was_stopped_is_stopped_and_a_failed_start_is_not() -> None:
    def report(outcomes: dict[int, Outcome]) -> SopReport:
        step = StepReport("run", "run")
        step.outcomes.update(outcomes)
        return SopReport("job", "RUN", "ssh", sorted(outcomes), steps=[step])

    halted = Outcome("failed", "job stopped (exit 143)", {"exit_code": 143, "stopped": True})
    both = finish.judge(_log({0: 143, 1: 143}), steps=report({0: halted, 1: halted}))
    assert both.code == ExitCode.STOPPED
    # The start failed on w0 and tpuops stopped what it had started on w1: the failure is the verdict.
    cancelled = Outcome("cancelled", "started pid 7, then stopped: the start failed on w0", {"stopped": True})
    start_failed = report({0: Outcome("failed", "mkdir: Permission denied"), 1: cancelled})
    assert finish.judge(None, steps=start_failed).code == ExitCode.FAILED
    # Nothing stopped: the steps' rule.
    ok = finish.judge(None, steps=report({0: Outcome("ok", "job exited 0")}))
    assert (ok.code, ok.words, ok.hint) == (ExitCode.OK, "ok", None)
