"""The follower's memory does not grow with the log: it reads, redacts and shows READ_CHUNK bytes at a time, in
the follow, the fetch and `tpuops logs` alike (the speed is bench/bench_follow.py's, docs/performance.md)."""

from __future__ import annotations

import threading
import tracemalloc
from pathlib import Path

from tpuops.logs.actions import Fetch, Follow
from tpuops.logs.chunks import LINE_LIMIT, READ_CHUNK
from tpuops.logs.follow import Follower
from tpuops.shell import Redactor
from tpuops.transport.local import LocalTransport

LOG_MB = 48  # 12 reads of READ_CHUNK; a whole-log read alone would hold 48 MiB twice (bytes, then text)


def test_follow_fetch_and_show_log_hold_a_few_chunks_whatever_the_log_size(tmp_path: Path) -> None:
    run = tmp_path / "vm" / "w0" / "runs" / "r1"
    run.mkdir(parents=True)
    log = run / "worker-0.log"
    line = b"x" * 8191 + b"\n"
    with log.open("wb") as f:
        for i in range(LOG_MB * 128):
            f.write(b"token=SECRET-42 " + line if i % 1000 == 0 else line)
        f.write(b"y" * (READ_CHUNK + 5))  # a line longer than LINE_LIMIT: shown in pieces, not held whole
        f.write(b"\nlast")
    (run / "worker-0.exit").write_text("0\n")
    size = log.stat().st_size
    counted = {"lines": 0, "secret": 0}

    def count(_: int, text: str) -> None:
        counted["lines"] += 1
        counted["secret"] += "SECRET-42" in text

    follower = Follower(LocalTransport(tmp_path / "vm", 1), redact=Redactor(["SECRET-42"]), on_line=count)
    tracemalloc.start()
    try:
        r = follower.follow(0, Follow("~/runs/r1", stream="all", timeout=300, poll_s=0.01), threading.Event())
        fetched = follower.fetch(0, Fetch("~/runs/r1"), tmp_path / "local")
        follower.show_log(0, "~/runs/r1/worker-0.log")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.ok and r.job_exit == 0 and r.offset == size and fetched.ok
    assert peak < 6 * READ_CHUNK, f"peak {peak / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB log"
    # Every line shown twice (follow, show_log), the long one as pieces of LINE_LIMIT characters.
    pieces = READ_CHUNK // LINE_LIMIT + 1
    assert counted == {"lines": 2 * (LOG_MB * 128 + 1 + pieces), "secret": 0}, counted
    copy = (tmp_path / "local" / "r1" / "worker-0.log").read_bytes()
    assert copy == log.read_bytes().replace(b"SECRET-42", b"***")
