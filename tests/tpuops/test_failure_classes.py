"""Failure classes end to end: a job's own failure lines become the exit code and `error_class` CI branches on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SOP = """name: job
params:
  cmd: {type: str}
scan: {source: log, warmup: 0}
steps:
  - kind: run
    command: "sh -c {cmd}"
    runs_dir: ~/runs
  - kind: follow
    runs_dir: ~/runs
    poll_s: 0.05
  - kind: fetch_log
    runs_dir: ~/runs
"""

CASES = {
    "oom": (
        "echo 'step=0 loss=0.100000 entropy=1.0000 reward_mean=0.0000 dt=1.00s'; "
        "echo 'jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
        "8.00GiB.'; exit 1",
        10,
    ),
    "tpu_busy": (
        "echo 'RuntimeError: Unable to initialize backend tpu: ABORTED: The TPU is already in use by process with "
        "pid 4242. Not attempting to load libtpu.so in this process.'; exit 1",
        4,
    ),
    "user_code": (
        'printf \'Traceback (most recent call last):\\n  File "train.py", line 3, in <module>\\n'
        "ValueError: my bug\\n'; exit 1",
        1,
    ),
    "ok": ("echo 'step=0 loss=0.100000 entropy=1.0000 reward_mean=0.0000 dt=1.00s'", 0),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_failure_lines_become_the_exit_code_and_error_class(kind: str, tmp_path: Path) -> None:
    cmd, code = CASES[kind]
    (tmp_path / "job.yaml").write_text(SOP)
    r = subprocess.run(
        [sys.executable, "-m", "tpuops", "sop", "run", str(tmp_path / "job.yaml"), "--local", "--json",
         "--set", f"cmd={cmd}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert r.returncode == code, r.stderr
    data = json.loads(r.stdout)
    assert (data["exit_code"], data["error_class"]) == (code, kind)
    kinds = [f["kind"] for f in data["log"]["failures"]]
    if kind == "ok":
        assert kinds == []
    else:
        assert kinds[0] == {"user_code": "traceback"}.get(kind, kind) and "exit_code" in kinds, kinds
