"""Time to resolve `--vm NAME` with and without `--zone` against the local TPU API emulator, and the
start-up cost of importing the google-cloud-tpu client.

    python3 bench/bench_locate.py [--repeat 20]

The emulator runs in-process on loopback, so the figures are tpuops' own overhead (client construction,
the REST calls, the parallel zone search, guest attributes); a real API adds its network round trips.
Prints medians side by side with ratios.
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
from collections.abc import Callable
from pathlib import Path


def _interleaved_ms(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Median wall time of each callable, run in rounds (A, B, C, A, B, C, ...) so that load from other
    processes on the machine falls on every variant alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


def _py(*argv: str, env: dict[str, str] | None = None) -> Callable[[], object]:
    return lambda: subprocess.run([sys.executable, *argv], check=True, capture_output=True, env=env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20, help="rounds in-process; CLI rounds are a quarter")
    args = ap.parse_args()
    n, n_cli = args.repeat, max(5, args.repeat // 4)

    tmp = Path(tempfile.mkdtemp(prefix="bench-locate-"))
    tmp.chmod(0o755)
    os.environ["TPUOPS_HOME"] = str(tmp / "home")
    from tpuops.cloud import locate
    from tpuops.cloud.client import connect
    from tpuops.cloud.create import CreateRequest, create_vm
    from tpuops.cloud.emulator.server import Emulator
    from tpuops.cloud.emulator.sshd import client_keypair
    from tpuops.config import TargetSpec

    _, public = client_keypair(tmp / "client")
    emu = Emulator(tmp / "emu", authorized_key=public)
    url = emu.start()
    cache = tmp / "home" / "zone-cache.json"
    try:
        api = connect(None, url)
        zones = emu.model.zones
        create_vm(api, CreateRequest("bench-v4-16", "v4-16", "base", ("us-east1-d",)))
        for i, z in enumerate(zones[:3]):  # a few other VMs so the search lists non-empty zones too
            create_vm(api, CreateRequest(f"other-{i}", "v4-8", "base", (z,)))

        def locate_ms(zone: str | None, keep_cache: bool) -> Callable[[], object]:
            spec = TargetSpec(vm="bench-v4-16", zone=zone, api_endpoint=url)

            def run() -> None:
                if not keep_cache:
                    cache.unlink(missing_ok=True)
                locate.locate_workers(spec, notify=lambda _m: None)

            return run

        locate_ms("us-east1-d", True)()  # imports and the first cache entry
        inproc = _interleaved_ms(
            {
                "zone": locate_ms("us-east1-d", True),
                "cached": locate_ms(None, True),
                "search": locate_ms(None, False),
            },
            n,
        )
        env = {**os.environ, "TPUOPS_TPU_API": url}
        describe = ("-m", "tpuops", "vm", "describe", "bench-v4-16", "--json")

        def cli_search() -> None:
            cache.unlink(missing_ok=True)
            _py(*describe, env=env)()

        cli = _interleaved_ms(
            {
                "bare": _py("-c", "pass"),
                "help": _py("-m", "tpuops", "--help"),
                "import": _py("-c", "from google.cloud import tpu_v2"),
                "zone": _py(*describe, "--zone", "us-east1-d", env=env),
                "cached": _py(*describe, env=env),
                "search": cli_search,
            },
            n_cli,
        )
    finally:
        emu.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"{len(zones)} emulated zones, a 2-worker VM; medians of {n} rounds in-process, {n_cli} of CLI runs"
    )
    print(f"{'what':60s} {'ms':>8s} {'ratio':>7s}")
    rows = [
        ("locate --vm NAME --zone Z (in-process, incl. client build)", inproc["zone"], inproc["zone"]),
        ("locate --vm NAME, zone from the cache", inproc["cached"], inproc["zone"]),
        (f"locate --vm NAME, parallel search of {len(zones)} zones", inproc["search"], inproc["zone"]),
        ("python3 -c pass", cli["bare"], cli["bare"]),
        ("tpuops --help", cli["help"], cli["bare"]),
        ("python3 -c 'from google.cloud import tpu_v2'", cli["import"], cli["bare"]),
        ("tpuops vm describe NAME --zone Z --json (CLI)", cli["zone"], cli["zone"]),
        ("tpuops vm describe NAME --json, zone cached (CLI)", cli["cached"], cli["zone"]),
        ("tpuops vm describe NAME --json, zones searched (CLI)", cli["search"], cli["zone"]),
    ]
    for what, ms, base in rows:
        print(f"{what:60s} {ms:8.1f} {ms / base:6.2f}x")


if __name__ == "__main__":
    main()
