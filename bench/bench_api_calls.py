"""TPU API calls and clients of one `tpuops run exec --vm NAME` against the emulator (real sshd worker).

    python3 bench/bench_api_calls.py [--workers 1|2] [--no-zone]

Runs the CLI in a subprocess whose google-cloud-tpu client class counts its constructions, then prints the
emulator's request log of that run grouped by call, the recovery watch's polls (purpose `watch`) apart.
The exec of `true` ends well inside the watch's first 10 s period, so the count does not depend on timing.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The CLI with TpuClient's constructor and the user-config loader counted (before and after issue 18 alike:
# both versions call `config.load` through the module attribute).
_COUNTING_CLI = """
import atexit, sys
from google.cloud import tpu_v2
from tpuops import config
built, loads = [0], [0]
init, load = tpu_v2.TpuClient.__init__, config.load
def counting(self, *a, **k):
    built[0] += 1
    init(self, *a, **k)
def counting_load(*a, **k):
    loads[0] += 1
    return load(*a, **k)
tpu_v2.TpuClient.__init__, config.load = counting, counting_load
atexit.register(lambda: sys.stderr.write(f"bench: TpuClient built {built[0]}, user config loaded {loads[0]}\\n"))
from tpuops.cli import main
sys.argv = ["tpuops", *sys.argv[1:]]
main()
"""


def _kind(line: str) -> str:
    """`METHOD /path` -> the API method it is (the names the TPU API's reference uses)."""
    method, path = line.split(" ", 1)
    if path.endswith(":getGuestAttributes"):
        return "getGuestAttributes"
    if "/nodes/" in path and method == "GET":
        return "nodes.get"
    if "/operations/" in path:
        return "operations.get"
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, choices=(1, 2), default=1)
    ap.add_argument("--no-zone", action="store_true", help="leave --zone out (the zone cache or search)")
    args = ap.parse_args()

    sys.path.insert(0, str(REPO))  # this checkout's tpuops, as the CLI subprocess (PYTHONPATH) gets it
    tmp = Path(tempfile.mkdtemp(prefix="bench-api-calls-"))
    tmp.chmod(0o755)
    from tpuops.cloud.client import connect
    from tpuops.cloud.create import CreateRequest, create_vm
    from tpuops.cloud.emulator.server import Emulator
    from tpuops.cloud.emulator.sshd import client_keypair, user_prefix

    identity, public = client_keypair(tmp / "client")
    emu = Emulator(tmp / "emu", zones=["us-east1-d", "us-central1-a"], authorized_key=public,
                   user_prefix=f"{user_prefix()}b")  # fmt: skip
    url = emu.start()
    try:
        create_vm(
            connect(None, url), CreateRequest("bench-vm", f"v4-{8 * args.workers}", "base", ("us-east1-d",))
        )
        env = {
            **os.environ, "TPUOPS_HOME": str(tmp / "home"), "TPUOPS_TPU_API": url,
            "CLOUDSDK_CONFIG": str(tmp / "no-gcloud"), "XDG_CONFIG_HOME": str(tmp / "xdg"),
            "PYTHONPATH": str(REPO),
        }  # fmt: skip
        env.pop("GOOGLE_CLOUD_PROJECT", None)
        zone = [] if args.no_zone else ["--zone", "us-east1-d"]
        argv = ["run", "exec", "--vm", "bench-vm", *zone, "--identity", str(identity), "--set", "cmd=true"]
        n = len(emu.model.requests)
        r = subprocess.run([sys.executable, "-c", _COUNTING_CLI, *argv], cwd=tmp, env=env, text=True,
                           capture_output=True, timeout=300, check=False)  # fmt: skip
        if r.returncode != 0:
            sys.exit(f"tpuops exited {r.returncode}:\n{r.stderr[-3000:]}")
        # Before issue 18 the log held "METHOD /path" strings with no client or purpose: read both shapes.
        calls = [
            (getattr(c, "line", c), getattr(c, "purpose", ""), getattr(c, "client", ""))
            for c in emu.model.requests[n:]
        ]
        watch = [line for line, purpose, _ in calls if purpose == "watch"]
        run = [line for line, purpose, _ in calls if purpose != "watch"]
        print(f"tpuops {' '.join(argv)}")
        print(next(ln for ln in r.stderr.splitlines() if ln.startswith("bench: ")))
        for kind, count in sorted(collections.Counter(_kind(line) for line in run).items()):
            print(f"{count:4d}  {kind}")
        print(f"{len(watch):4d}  (watch polls, not counted above)")
        clients = sorted({client for _, _, client in calls if client})
        print(f"{len(clients):4d}  client id(s) in the request headers: {', '.join(clients)}")
    finally:
        emu.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
