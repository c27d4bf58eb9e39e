"""A hung job judged once, read any way: followed to its hang, or detached and attached until the hang, it is exit
9, and `tpuops report RUN_ID` after the fact says 9 too, before and after `tpuops stop` ended the job (no log
says a job hung: the verdict its follow recorded does)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tpuops.conftest import SshdPool
from tests.tpuops.run.test_one_verdict import lose_client, newest_run, run_cli
from tpuops.errors import ExitCode

pytestmark = pytest.mark.slow

# Three steps, then no more progress (the job would sleep on for minutes): hung after 2 s (hang_min_s).
# The TPU lock `tpuops stop` clears is the worker's own (/tmp is shared by every worker user of the machine).
SOP = """name: hang
params:
  lockfile: {type: path, default: ~/libtpu_lockfile}
scan: {source: log, warmup: 1}
steps:
  - kind: run
    command: "echo step=0 dt=0.1s; echo step=1 dt=0.1s; echo step=2 dt=0.1s; sleep 300"
    runs_dir: ~/runs
  - kind: follow
    runs_dir: ~/runs
    poll_s: 0.1
    timeout: 120
    hang_factor: 2
    hang_min_s: 2
  - kind: fetch_log
    runs_dir: ~/runs
"""


def _reported_then_stopped(run_id: str, cwd: Path) -> None:
    """`report RUN_ID` says 9 while the hung job goes on, `stop` ends it, and `report RUN_ID` still says 9."""
    for stop in (False, True):
        if stop:
            stopped = run_cli("stop", run_id, cwd=cwd)
            assert stopped.returncode == 0, stopped.stderr
        reported = run_cli("report", run_id, cwd=cwd)
        assert reported.returncode == ExitCode.HANG, (stop, reported.stderr[-3000:])


def test_a_hang_followed_or_attached_is_9_and_report_says_so_after_the_fact(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    (w,) = sshd_pool.take(1)
    hosts = sshd_pool.host_args([w])
    sop = tmp_path / "hang.yaml"
    sop.write_text(SOP)

    followed = run_cli("sop", "run", str(sop), *hosts, cwd=tmp_path)
    assert followed.returncode == ExitCode.HANG, followed.stderr[-3000:]
    _reported_then_stopped(newest_run(tmp_path), tmp_path)

    # The same job, its client killed once the job runs (the laptop goes away), then attached until the hang.
    lose_client(["sop", "run", str(sop), *hosts], tmp_path, w.home, jobs=2)
    run_id = newest_run(tmp_path)
    attached = run_cli("attach", run_id, cwd=tmp_path)
    assert attached.returncode == ExitCode.HANG, attached.stderr[-3000:]
    _reported_then_stopped(run_id, tmp_path)
