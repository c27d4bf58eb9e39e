"""Fan-out benchmark: a 6-step SOP on N loopback sshd workers, tpuops against one fresh `ssh` per step per worker.

Run: python bench/bench_sop.py [--workers 1 8 32] [--repeats 3]
Prints, per N: tpuops' wall time, the seed procedures' way (sequential `ssh` processes), and their ratio;
then N=32 over N=1 for tpuops, and the median start-up time of `tpuops --help`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tpuops.cloud.emulator.sshd import client_keypair, remove_users, start_worker
from tpuops.sop.executor import Executor
from tpuops.sop.loader import Sop
from tpuops.transport.base import Worker
from tpuops.transport.ssh import SshTransport

# Six small steps of the kind a TPU SOP runs (inspect, lock, dirs, env, versions, marker).
STEPS = [
    "test -e ~/libtpu_lockfile && echo held || echo free",
    "rm -f ~/libtpu_lockfile",
    "mkdir -p ~/tpuops/runs",
    "ls -a ~ > /dev/null",
    "git --version > /dev/null",
    "date +%s > ~/tpuops/runs/marker",
]
SOP = Sop.model_validate(
    {
        "name": "bench6",
        "steps": [{"kind": "shell", "name": f"s{i}", "command": c} for i, c in enumerate(STEPS)],
    }
)


def tpuops_time(workers: list, key: Path, known_hosts: Path) -> float:
    t0 = time.perf_counter()
    transport = SshTransport(
        [Worker(i, "127.0.0.1", w.port, w.user, w.fingerprint) for i, w in enumerate(workers)],
        known_hosts=known_hosts,
        identity=key,
    )
    report = Executor(transport, parallel=32).execute(SOP, {}, "bench", list(range(len(workers))))
    transport.close()
    assert report.ok, report.first_failure()
    return time.perf_counter() - t0


def seed_time(workers: list, key: Path, known_hosts: Path) -> float:
    t0 = time.perf_counter()
    for w in workers:
        for cmd in STEPS:
            subprocess.run(
                ["ssh", "-q", "-i", str(key), "-p", str(w.port), "-o", f"UserKnownHostsFile={known_hosts}",
                 "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"{w.user}@127.0.0.1", cmd],
                check=True, capture_output=True, stdin=subprocess.DEVNULL,
            )  # fmt: skip
    return time.perf_counter() - t0


def server_cpu_s(workers: list) -> float:
    """CPU seconds used so far by the sshd listeners and every session they reaped (utime+stime+cutime+cstime)."""
    import os

    total = 0
    for w in workers:
        fields = Path(f"/proc/{w.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def help_time(repeats: int = 10) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tpuops", "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-sop-"))
    base.chmod(0o755)
    key, public = client_keypair(base / "client")
    pool = [start_worker(k, base / f"w{k}", public) for k in range(max(args.workers))]
    known_hosts = base / "known_hosts"
    known_hosts.write_text("".join(f"[127.0.0.1]:{w.port} {w.host_public_key}\n" for w in pool))
    try:
        cores = len(os.sched_getaffinity(0))
        print(
            f"{'N':>3} {'tpuops s':>9} {'ssh-per-step s':>15} {'ratio':>7} {'sshd CPU s':>11} {'floor s':>8}"
        )
        tp: dict[int, float] = {}
        for n in args.workers:
            ws = pool[:n]
            cpu0 = server_cpu_s(ws)
            t = statistics.median(tpuops_time(ws, key, known_hosts) for _ in range(args.repeats))
            time.sleep(0.5)  # let the listeners reap their session children
            cpu = (server_cpu_s(ws) - cpu0) / args.repeats
            s = statistics.median(seed_time(ws, key, known_hosts) for _ in range(args.repeats))
            tp[n] = t
            # All N "workers" share this machine's cores: their sshd CPU time over the cores is a floor.
            print(f"{n:>3} {t:>9.3f} {s:>15.3f} {t / s:>7.3f} {cpu:>11.3f} {cpu / cores:>8.3f}")
        if 1 in tp and max(tp) > 1:
            print(f"tpuops N={max(tp)} / N=1: {tp[max(tp)] / tp[1]:.2f}x")
        print(f"tpuops --help start-up (median of 10): {help_time():.3f} s")
        print(f"python -c pass (floor):                 {_python_floor():.3f} s")
    finally:
        remove_users(pool)  # stops each sshd; deletes the users and homes this run created


def _python_floor() -> float:
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    main()
