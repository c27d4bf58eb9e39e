"""Run records are written whole or not at all: a writer killed at any moment never leaves half a record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpuops.errors import UsageError
from tpuops.run import store

# Rewrites one record as fast as it can: ~2 MB of JSON each time, so a kill lands inside a write.
WRITER = """
import json, sys
from tpuops.config import write_atomic
target, i = sys.argv[1], 0
while True:
    i += 1
    write_atomic(target, json.dumps({"i": i, "pad": "x" * (2 << 20)}))
    print(i, flush=True)
"""


def test_a_writer_killed_mid_write_leaves_the_previous_whole_record(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    for _ in range(3):  # a few kills at different moments
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True
        )
        assert writer.stdout is not None
        done = int(writer.stdout.readline())  # at least one complete write, then more under way
        time.sleep(0.05)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        data = json.loads(target.read_text())  # always a whole record: never cut short
        assert data["i"] >= done and len(data["pad"]) == 2 << 20
    strays = [p for p in tmp_path.iterdir() if p != target]
    assert all(p.name.startswith(".run.json.") and p.name.endswith(".tmp") for p in strays)


def test_a_cut_short_record_is_not_listed_and_loading_it_says_why(tmp_path: Path) -> None:
    root = Path(os.environ["TPUOPS_HOME"]) / "runs"
    good = {"run_id": "20260101-000000-smoke-aaaa", "sop": "smoke", "target": {"kind": "local"}, "workers": [0],
            "values": {}, "started": 1.0}  # fmt: skip
    (root / good["run_id"]).mkdir(parents=True)
    (root / good["run_id"] / "run.json").write_text(json.dumps(good))
    broken = root / "20260102-000000-smoke-bbbb"
    broken.mkdir()
    (broken / "run.json").write_text(json.dumps(good)[:40])  # what a non-atomic writer left when killed
    assert [r.run_id for r in store.list_runs()] == [good["run_id"]]
    with pytest.raises(UsageError, match="is unreadable"):
        store.load(broken.name)
