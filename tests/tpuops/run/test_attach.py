"""The laptop disconnects mid-run (tpuops killed); `tpuops attach` resumes with no lost or repeated line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.tpuops.conftest import SshdPool


def _lines(text: str) -> list[str]:
    return [ln.split("] ", 1)[1] for ln in text.splitlines() if ln.startswith("[w0] step=")]


def test_attach_after_the_follower_is_killed(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    workers = sshd_pool.take(2)
    args = [sys.executable, "-m", "tpuops", "sop", "run", "smoke", *sshd_pool.host_args(workers)]
    sets = {"repo_url": str(git_remote[0]), "steps": "40", "step_seconds": "0.1", "lockfile": "~/l"}
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    env = {**os.environ, "COLUMNS": "200"}
    first = subprocess.Popen(
        args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    assert first.stderr is not None
    shown: list[str] = []
    deadline = time.monotonic() + 60
    while len(shown) < 8 and time.monotonic() < deadline:
        line = first.stderr.readline()
        if line.startswith("[w0] step="):
            shown.append(line.strip().split("] ", 1)[1])
    time.sleep(0.2)  # between two polls
    first.send_signal(signal.SIGKILL)
    # Read through the same buffered file as readline() above (communicate() would skip its read-ahead).
    rest = first.stderr.read()
    first.wait()
    shown += _lines(rest)  # what it printed before it died
    (record,) = _runs(tmp_path)
    # Asked of the workers: the job goes on (or, on a slow machine, has just finished).
    assert record["status"] in ("running", "exited 0"), record
    attached = subprocess.run(
        [sys.executable, "-m", "tpuops", "attach", record["run_id"]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert attached.returncode == 0, attached.stderr
    again = _lines(attached.stderr)
    every = [f"step={i} loss=0.000000 entropy=0.0000 reward_mean=0.0000 dt=0.1s" for i in range(40)]
    assert shown + again == every  # nothing lost, nothing twice
    assert len(again) >= 10  # the attach really had lines left to show
    # The local copies were fetched after the run ended.
    local = Path(os.environ["TPUOPS_HOME"]) / "runs" / record["run_id"]
    assert (local / "worker-1.log").read_text().count("step=") == 40
    # The attach recorded how the run ended (the follower that started it died before it could).
    assert [r["status"] for r in _runs(tmp_path)] == ["ok"]
    result = json.loads((local / "result.json").read_text())
    assert result["exit_code"] == 0 and result["exit_codes"] == {"0": 0, "1": 0}


def _runs(cwd: Path) -> list[dict]:
    """`tpuops runs --json`, parsed."""
    out = subprocess.run(
        [sys.executable, "-m", "tpuops", "runs", "--json"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)
