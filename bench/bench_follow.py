"""Log-follow benchmark: tpuops following (and then fetching) a finished worker log, next to `cat`.

Run: python bench/bench_follow.py [--size-mb 150] [--repeats 3]
Writes a log in the trainer's format (bench_logscan.write_log) as worker 0's log of a finished run under a
local transport's scratch root, then in a fresh process per repeat, pinned to one core, runs what `tpuops run`
and `tpuops attach` do with it: the follower (read from the worker, redact two .env values, show every line
through the console, scan it) until the exit file, then the fetch of the redacted local copy. Stderr goes to
/dev/null (the console's real formatting still runs). Reports wall and CPU time (the machine may be shared: lines per CPU
second is the load-independent figure), lines/s, the ratio to `cat LOG > /dev/null` (the floor) and the
process's peak RSS. Medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_logscan import write_log  # noqa: E402  (a sibling script, not a package)

FOLLOW = """
import json, os, resource, sys, threading, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from pathlib import Path
from tpuops import console
from tpuops.logs.actions import Fetch, Follow
from tpuops.logs.follow import Follower
from tpuops.shell import Redactor
from tpuops.transport.local import LocalTransport
root, local = Path(sys.argv[1]), Path(sys.argv[2])
redact = Redactor(["wandb-0123456789abcdef0123456789abcdef", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"])
shown = [0]
def on_line(w, text):
    shown[0] += 1
    console.line(w, text)
follower = Follower(LocalTransport(root, 1), redact=redact, on_line=on_line)
u = resource.getrusage(resource.RUSAGE_SELF)
cpu0, t0 = u.ru_utime + u.ru_stime, time.perf_counter()
r = follower.follow(0, Follow("~/runs/bench", stream="first", timeout=3600.0, poll_s=0.5), threading.Event())
t1 = time.perf_counter()
u = resource.getrusage(resource.RUSAGE_SELF)
f = follower.fetch(0, Fetch("~/runs/bench"), local)
t2 = time.perf_counter()
print(json.dumps({
    "follow_s": t1 - t0, "fetch_s": t2 - t1, "follow_cpu_s": u.ru_utime + u.ru_stime - cpu0, "shown": shown[0],
    "follow_ok": r.ok, "fetch_ok": f.ok,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6,
}), flush=True)
"""


def run_follow(root: Path, local: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", FOLLOW, str(root), str(local)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    return json.loads(out.stdout)


def cat_time(path: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "root" / "w0" / "runs" / "bench"
        run.mkdir(parents=True)
        log = run / "worker-0.log"
        write_log(log, args.size_mb)
        (run / "worker-0.exit").write_text("0\n")
        lines = sum(1 for _ in log.open("rb"))
        size = log.stat().st_size
        print(f"log: {size / 2**20:.0f} MiB, {lines} lines")
        cat_time(log)  # the page cache is warm from here on
        results, cats = [], []
        for i in range(args.repeats):
            results.append(run_follow(Path(tmp) / "root", Path(tmp) / f"local{i}"))
            cats.append(cat_time(log))
        assert all(r["follow_ok"] and r["fetch_ok"] and r["shown"] == lines for r in results), results
        follow = statistics.median(r["follow_s"] for r in results)
        fetch = statistics.median(r["fetch_s"] for r in results)
        cpu = statistics.median(r["follow_cpu_s"] for r in results)
        cat = statistics.median(cats)
        rss = max(r["peak_rss_mb"] for r in results)
        print(f"{'':34}{'median':>10}  runs")
        print(
            f"{'follow: read+redact+show+scan (s)':34}{follow:10.2f}  {[round(r['follow_s'], 2) for r in results]}"
        )
        print(
            f"{'fetch: redacted local copy (s)':34}{fetch:10.2f}  {[round(r['fetch_s'], 2) for r in results]}"
        )
        print(f"{'cat LOG > /dev/null (s)':34}{cat:10.3f}  {[round(c, 3) for c in cats]}")
        print(f"{'follow CPU time (s)':34}{cpu:10.2f}  {[round(r['follow_cpu_s'], 2) for r in results]}")
        print(f"{'follow lines/s (wall, one core)':34}{lines / follow:10.0f}")
        print(f"{'follow lines per CPU second':34}{lines / cpu:10.0f}")
        print(f"{'ratio follow / cat':34}{follow / cat:10.0f}")
        print(f"{'peak RSS, follow + fetch (MB)':34}{rss:10.0f}  (log {size / 1e6:.0f} MB)")
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"load average {' '.join(load)} on {len(os.sched_getaffinity(0))} cores")
        ok = lines / cpu >= 100_000
        print(f"acceptance: >= 100,000 lines per CPU second {'PASS' if ok else 'FAIL'} (wall: see the load)")


if __name__ == "__main__":
    main()
