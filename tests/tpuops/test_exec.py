"""`tpuops sop run exec` on real sshd workers: every line of each worker's output, and its timeout honoured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.tpuops.conftest import SshdPool
from tpuops.transport.base import Worker
from tpuops.transport.ssh import EOF_GRACE_S, SshTransport


def tpuops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuops", "sop", "run", "exec", *args], cwd=cwd, capture_output=True, text=True,
        timeout=120, stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "200"}, check=False,
    )  # fmt: skip


def test_exec_shows_every_line_of_every_worker_and_json_carries_them(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    workers = sshd_pool.take(2)
    cmd = 'echo "first of $(whoami)"; echo "to stderr" >&2; echo last'
    r = tpuops(*sshd_pool.host_args(workers), "--set", f"cmd={cmd}", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for k, w in enumerate(workers):
        for line in (f"first of {w.user}", "to stderr", "last"):
            assert f"[w{k}] {line}\n" in r.stderr, r.stderr
        got = json.loads(r.stdout)["steps"][0]["workers"][str(k)]
        assert (got["stdout"], got["stderr"]) == (f"first of {w.user}\nlast\n", "to stderr\n"), got
    big = tpuops(*sshd_pool.host_args(workers[:1]), "--set", "cmd=seq 1 30000", "--json", cwd=tmp_path)
    got = json.loads(big.stdout)["steps"][0]["workers"]["0"]
    assert got["stdout"].endswith("29999\n30000\n") and len(got["stdout"]) == 64 * 1024
    assert got["stdout_note"].startswith("cut: only the last 65536 of 168894 characters are kept")


def test_exec_timeout_stops_the_command_exit_5_in_both_outputs(sshd_pool: SshdPool, tmp_path: Path) -> None:
    (w,) = sshd_pool.take(1)
    for mode in ([], ["--json"]):
        t0 = time.monotonic()
        r = tpuops(
            *sshd_pool.host_args([w]), "--set", "cmd=sleep 30", "--set", "timeout=1", *mode, cwd=tmp_path
        )
        assert r.returncode == 5 and time.monotonic() - t0 < 15, r.stderr
        if mode:
            assert json.loads(r.stdout)["error_class"] == "timeout"
        else:
            assert r.stderr.strip().endswith("exit code 5") and "timed out after 1s" in r.stderr
    bad = tpuops(*sshd_pool.host_args([w]), "--set", "cmd=true", "--set", "timeout=soon", cwd=tmp_path)
    assert bad.returncode == 2 and "parameter timeout must be float, received 'soon'" in bad.stderr


def test_output_sent_after_the_exit_status_is_kept_and_a_child_holding_the_pipes_does_not_hang_the_run(
    sshd_pool: SshdPool,
) -> None:
    """sshd sends the exit status when the shell exits; what its pipes still hold (a line the shell's child writes
    a moment later, as a slow pipe read does) comes after it, before the end of file: every line is kept."""
    (w,) = sshd_pool.take(1)
    t = SshTransport(
        [Worker(0, "127.0.0.1", w.port, w.user, w.fingerprint)], known_hosts=Path("/nonexistent"),
        identity=sshd_pool.key,
    )  # fmt: skip
    seen: list[str] = []
    try:
        r = t.run(
            0,
            "echo first; (sleep 0.3; echo late >&2; echo later) &",
            on_line=lambda _w, line: seen.append(line),
        )
        assert r.ok and (r.stdout, r.stderr) == ("first\nlater\n", "late\n"), r
        assert sorted(seen) == [
            "first",
            "late",
            "later",
        ]  # each once, live (stdout and stderr are not ordered)
        # A child that keeps the pipes open past the grace: the run ends EOF_GRACE_S after the last data.
        t0 = time.monotonic()
        held = t.run(0, "sleep 20 & echo $!")
        assert held.ok and time.monotonic() - t0 < EOF_GRACE_S + 5, held
    finally:
        if "held" in locals() and held.stdout.strip().isdigit():
            t.run(0, f"kill {held.stdout.strip()}")
        t.close()
