"""Wall time of `tpuops vm list` (and `--json`, and one zone) against the local emulator, as a user runs it:
a new process each time, median of several runs.

    python3 bench/bench_vm_list.py [--repeat 9]

The emulator runs in this process on loopback with its 12 zones, a Cloud TPU node, a 2-slice multislice, a
Compute Engine TPU instance and a MIG slice, so every backend lists something; the figures are tpuops' own cost
(start-up, imports, the parallel zone listing, Compute Engine's two aggregated lists). A real API adds its
round trips.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9, help="runs of each command (the median is shown)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-vm-list-"))
    tmp.chmod(0o755)
    os.environ["TPUOPS_HOME"] = str(tmp / "home")
    from tpuops.cloud.backends import REGISTRY
    from tpuops.cloud.client import connect
    from tpuops.cloud.create import CreateRequest
    from tpuops.cloud.emulator.server import Emulator
    from tpuops.cloud.emulator.sshd import client_keypair

    _, public = client_keypair(tmp / "client")
    emu = Emulator(tmp / "emu", authorized_key=public)
    url = emu.start()
    try:
        api = connect(None, url)
        shapes = {"node": ("v4-8", 1, "base"), "multislice": ("v4-8", 2, "base"),
                  "instance": ("tpu7x-8", 1, ""), "mig": ("tpu7x-16", 1, "")}  # fmt: skip
        for kind, (acc, slices, version) in shapes.items():
            req = CreateRequest(f"bench-{kind}", acc, version, ("us-east5-a",), wait=True, slices=slices)
            REGISTRY[kind].create(api, req, version)
        env = {**os.environ, "TPUOPS_TPU_API": url}
        commands = {
            "tpuops vm list": ["vm", "list"],
            "tpuops vm list --json": ["vm", "list", "--json"],
            "tpuops vm list --zone us-east5-a": ["vm", "list", "--zone", "us-east5-a"],
            "tpuops --help": ["--help"],
        }
        times: dict[str, list[float]] = {k: [] for k in commands}
        for _ in range(args.repeat):  # interleaved: load from other processes falls on every command alike
            for name, argv in commands.items():
                t0 = time.perf_counter()
                r = subprocess.run(
                    [sys.executable, "-m", "tpuops", *argv],
                    check=False,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                times[name].append(time.perf_counter() - t0)
                if r.returncode != 0:
                    raise SystemExit(f"{name}: exit {r.returncode}: {r.stderr[-500:]}")
        rows = subprocess.run([sys.executable, "-m", "tpuops", "vm", "list"], check=False, env=env, capture_output=True,
                              text=True).stderr  # fmt: skip
    finally:
        emu.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"{len(emu.model.zones)} emulated zones, one VM of each backend; median (min-max) of {args.repeat} runs"
    )
    for name, ts in times.items():
        print(f"{name:40s} {statistics.median(ts):6.2f} s  ({min(ts):.2f}-{max(ts):.2f})")
    print(rows)


if __name__ == "__main__":
    main()
