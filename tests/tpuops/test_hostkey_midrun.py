"""A worker's sshd restarts with a new host key mid-run: the follow ends at once with exit 3 and the line that
names the worker and both fingerprints (never silent retries until the follow's timeout)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.tpuops.conftest import SshdPool, _clean
from tests.tpuops.test_usage_errors import ENTRY

SOP = """name: longjob
description: a detached job that prints a line every 0.1 s for a minute (tests)
steps:
  - kind: run
    runs_dir: ~/runs
    command: "i=0; while [ $i -lt 600 ]; do echo step=$i dt=0.1s; i=$((i+1)); sleep 0.1; done"
  - kind: follow
    runs_dir: ~/runs
    timeout: 600
"""


def test_a_host_key_changed_mid_run_ends_the_follow_with_exit_3_naming_both_keys(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    workers = sshd_pool.take(2)
    (tmp_path / "longjob.yaml").write_text(SOP)
    old = workers[1].fingerprint
    proc = subprocess.Popen(
        [*ENTRY, "sop", "run", "./longjob.yaml", *sshd_pool.host_args(workers)],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.stderr.readline().startswith("[w0] step=3"):
                break
        workers[1].drop_connections()  # the restart drops every session; the detached jobs go on
        workers[1].regenerate_host_key()
        new = workers[1].fingerprint
        t0 = time.monotonic()
        rest = (
            proc.stderr.read()
        )  # the same buffered file readline() used (communicate would skip its read-ahead)
        proc.wait(timeout=120)
        took = time.monotonic() - t0
        # `attach` (the jobs still run) meets the same key: the same line, exit 3, at once.
        run_id = next(ln.split("run ")[1].split()[0] for ln in rest.splitlines() if "longjob  run " in ln)
        attached = subprocess.run(
            [*ENTRY, "attach", run_id], cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for w in workers:
            _clean(w)  # the test's own worker users: their detached jobs stop here
    assert proc.returncode == 3, rest[-3000:]
    assert took < 30, took  # prompt: not the follow's 600 s timeout
    named = [ln for ln in rest.splitlines() if ln.startswith("failed: step follow on w1: host key of w1")]
    assert named and old in named[0] and new in named[0] and old != new, rest[-3000:]
    assert attached.returncode == 3 and "host key of w1" in attached.stderr and new in attached.stderr, (
        attached.stderr[-2000:]
    )
