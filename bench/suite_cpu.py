"""Each test's CPU, for choosing what to cut from the suite (docs/performance.md, "The whole suite").

A pytest plugin: around each test it reads the machine's busy CPU time from /proc/stat (user + system + irq +
softirq + steal of every core, not `nice`), so the trainer processes, sshd workers and emulators a test starts are
counted whoever their parent is. Per-process figures are not (`/usr/bin/time` misses daemons' children, and in
this container reported 41 s of user time for a 2-second libtpu process). Meaningful only in a serial run on an
otherwise quiet machine (anything you run beside it at nice 0 is counted; run it at `nice -n 19`):

    PYTHONPATH=bench python -m pytest -p no:xdist -p suite_cpu -q -p no:cacheprovider
    python bench/suite_cpu.py suite-cpu.jsonl      # the costliest tests and modules

One JSON line per test (`id`, `cpu` and `wall` seconds, its `start` time and xdist `worker`) goes to
$SUITE_CPU_OUT (default suite-cpu.jsonl). In an xdist run (`-n 3`) only `start`, `wall` and `worker` mean
something: a timeline of which test each worker ran when, to set beside the machine's idle time (`vmstat 5`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def busy_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot, niced work left out."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, _nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    cpu, wall, start = busy_seconds(), time.perf_counter(), time.time()
    yield
    row = {
        "id": item.nodeid,
        "cpu": busy_seconds() - cpu,
        "wall": time.perf_counter() - wall,
        "start": start,
        "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
    }
    with Path(os.environ.get("SUITE_CPU_OUT", "suite-cpu.jsonl")).open("a") as out:
        out.write(json.dumps(row) + "\n")


def main(path: str, top: int = 30) -> None:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    modules: dict[str, float] = {}
    for r in rows:
        module = r["id"].split("::")[0]
        modules[module] = modules.get(module, 0.0) + r["cpu"]
    print(
        f"{len(rows)} tests, {sum(r['cpu'] for r in rows):.0f} s of CPU, {sum(r['wall'] for r in rows):.0f} s"
    )
    for r in sorted(rows, key=lambda r: -r["cpu"])[:top]:
        print(f"{r['cpu']:7.0f} {r['wall']:7.0f}  {r['id']}")
    for name, cpu in sorted(modules.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{cpu:7.0f}  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
