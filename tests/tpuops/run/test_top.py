"""`tpuops top RUN_ID` on a live run: every worker asked at once while its job runs (real sshd workers, the
smoke SOP, which prints step lines without chip fields, as a CPU trainer does)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.tpuops.conftest import SshdPool
from tests.tpuops.run.test_detach import _start, _states, _tpuops, _wait_for_steps


@pytest.mark.slow
def test_top_shows_every_worker_of_a_live_run_and_says_the_memory_fields_are_absent(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    workers = sshd_pool.take(2)
    proc = _start(sshd_pool, workers, git_remote[0], tmp_path, steps=400)
    shown = _wait_for_steps(proc, 3)
    proc.send_signal(signal.SIGINT)  # detach: the job goes on
    assert proc.wait(timeout=30) == 130
    ((run_id, _),) = _states(tmp_path).items()
    try:
        top = _tpuops(tmp_path, "top", run_id, "--once", "--json")
        assert top.returncode == 0, top.stderr
        snap = json.loads(top.stdout)
        assert [w["worker"] for w in snap["workers"]] == [0, 1]
        assert [w["state"] for w in snap["workers"]] == ["running", "running"]
        assert snap["workers"][0]["step"] >= int(shown[-1].split()[0].removeprefix("step="))
        assert snap["memory_fields"] is False and all(w["chips"] is None for w in snap["workers"])
        people = _tpuops(tmp_path, "top", run_id, "--once")
        assert people.returncode == 0, people.stderr
        assert "memory fields absent" in people.stderr and "w0" in people.stderr and "w1" in people.stderr
        assert "running" in people.stderr
    finally:
        assert _tpuops(tmp_path, "stop", run_id).returncode == 0
    # A TPU's lines, as the trainer prints them there (process 0's step line, process 1's `chips:` line):
    # each worker's latest sample, per chip.
    logs = [w.home / "tpuops" / "runs" / run_id / f"worker-{k}.log" for k, w in enumerate(workers)]
    with logs[0].open("a") as f:
        f.write("step=400 reward_mean=0.5000 reward_delta=+0.0000 entropy=1.0000 dt=2.00s loss=0.000000 "
                "hbm_gb_min=20.10 hbm_gb_max=22.40 hbm_gb_peak=23.50 hbm_gb_limit=33.60 duty_pct_min=61.0 "
                "duty_pct_max=74.5 hbm_gb_chips=20.10/22.40 duty_pct_chips=61.0/74.5\n")  # fmt: skip
    with logs[1].open("a") as f:
        f.write("chips: step=400 process=1 hbm_gb_min=18.00 hbm_gb_max=19.50 hbm_gb_chips=18.00/19.50\n")
    snap = json.loads(_tpuops(tmp_path, "top", run_id, "--json").stdout)
    assert [w["state"] for w in snap["workers"]] == ["exited 143", "exited 143"]
    assert snap["memory_fields"] is True and snap["note"] is None
    w0, w1 = snap["workers"]
    assert (
        w0["step"] == 400
        and w0["chips"]["hbm_gb_chips"] == [20.1, 22.4]
        and w0["chips"]["duty_pct_max"] == 74.5
    )
    assert w1["step"] == 400 and w1["chips"] == {
        "hbm_gb_min": 18.0,
        "hbm_gb_max": 19.5,
        "hbm_gb_chips": [18.0, 19.5],
    }
    table = _tpuops(tmp_path, "top", run_id).stderr  # the job has ended: one snapshot
    assert "22.40" in table and "74.5" in table and "19.50" in table and "memory fields absent" not in table
