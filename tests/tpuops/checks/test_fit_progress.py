"""`tpuops fit` at a terminal: trainer.fit's progress lines reach the status line as they come."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tpuops.checks import fit as fitlib

SCRIPT = """
import sys, time
print("fit: compiling prefill", file=sys.stderr, flush=True)
time.sleep(1.0)
print("fit: compiled prefill in 1.0 s", file=sys.stderr, flush=True)
print("some other stderr line", file=sys.stderr, flush=True)
print('{"fits": true}')
"""


def test_progress_lines_arrive_while_the_compile_runs(tmp_path: Path) -> None:
    heard: list[tuple[float, str]] = []
    t0 = time.monotonic()
    r = fitlib._run([sys.executable, "-c", SCRIPT], tmp_path, lambda ln: heard.append((time.monotonic(), ln)))
    ended = time.monotonic()
    assert r.returncode == 0 and r.stdout.strip() == '{"fits": true}' and "some other stderr line" in r.stderr
    assert [ln for _, ln in heard] == ["fit: compiling prefill", "fit: compiled prefill in 1.0 s"]
    assert heard[0][0] - t0 < ended - t0 - 0.5  # heard during the compile, not after the process ended


def test_the_status_names_the_program_compiling_and_for_how_long() -> None:
    p = fitlib.FitProgress("qwen2.5-3b-v6e-8")
    now = [100.0]
    p.clock = lambda: now[0]
    p.started = p.since = 100.0
    assert p.status() == "fit qwen2.5-3b-v6e-8: tracing the step's programs · elapsed 0s"
    now[0] = 103.0
    p.feed("fit: compiling decode_cast")
    now[0] = 110.0
    assert p.status() == "fit qwen2.5-3b-v6e-8: compiling decode_cast for the TPU 7s · elapsed 10s"
    p.feed("fit: compiled decode_cast in 7.0 s")
    p.feed("fit: compiling prefill")
    now[0] = 131.0
    assert p.status() == (
        "fit qwen2.5-3b-v6e-8: compiling prefill for the TPU 21s · elapsed 31s · compiled: decode_cast 7.0s"
    )
