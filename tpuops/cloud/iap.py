"""IAP TCP forwarding: one `gcloud compute start-iap-tunnel INSTANCE 22` per worker, on a local port.

This is what `gcloud alpha compute tpus tpu-vm ssh --tunnel-through-iap` does: it reads each worker's
underlying instance name from the node's guest attributes (key `hostname`) and opens an IAP tunnel to that
instance in the node's zone and project (the instance form; the IP form would need --region/--network).
IAP's WebSocket protocol is gcloud's own, so gcloud runs as a subprocess for the tunnel alone; the SSH
session over it is tpuops' own (paramiko, pinned host keys).
"""

from __future__ import annotations

import atexit
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from tpuops.errors import ConnectError, PermissionDeniedError

GCLOUD_ENV = (
    "TPUOPS_GCLOUD"  # the gcloud command line tpuops runs for tunnels (tests: the emulator's forwarder)
)
_LISTENING = re.compile(r"Listening on port \[(\d+)\]")
ROLE_HINT = (
    "needs roles/iap.tunnelResourceAccessor on the project, and a firewall rule letting 35.235.240.0/20 "
    "reach tcp:22"
)


def gcloud_command() -> list[str]:
    raw = os.environ.get(GCLOUD_ENV)
    if raw:
        return shlex.split(raw)
    exe = shutil.which("gcloud")
    if exe is None:
        raise ConnectError(
            "the IAP tunnel needs gcloud (it speaks IAP's tunnel protocol) and none is on PATH",
            hint="install the Google Cloud CLI and run `gcloud auth login`, or use --internal-ip from inside "
            f"the VPC (or set ${GCLOUD_ENV} to the gcloud command)",
        )
    return [exe]


class Tunnels:
    """The running tunnel processes of one transport; `close()` (also at exit) stops them by process group."""

    def __init__(self, project: str, zone: str, timeout: float = 60.0) -> None:
        self.project, self.zone, self.timeout = project, zone, timeout
        self.command = gcloud_command()
        self.procs: list[subprocess.Popen[str]] = []
        self._lock = threading.Lock()
        atexit.register(self.close)

    def open_all(self, instances: list[str], port: int = 22) -> list[int]:
        """One tunnel per instance, started at once; local ports in the same order."""
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(instances)))) as pool:
            futures = [pool.submit(self.open, name, port) for name in instances]
            try:
                return [f.result() for f in futures]
            except BaseException:
                self.close()
                raise

    def open(self, instance: str, port: int = 22) -> int:
        argv = [
            *self.command,
            "compute",
            "start-iap-tunnel",
            instance,
            str(port),
            "--local-host-port=localhost:0",
            f"--zone={self.zone}",
            f"--project={self.project}",
        ]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            process_group=0,  # its own group: close() stops gcloud and whatever it started
        )
        with self._lock:
            self.procs.append(proc)
        lines: deque[str] = deque(maxlen=20)
        found = threading.Event()
        local: list[int] = []

        def read() -> None:  # keeps draining after "Listening" so the pipe never fills up
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.strip())
                m = _LISTENING.search(line)
                if m and not found.is_set():
                    local.append(int(m.group(1)))
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + self.timeout
        while not found.wait(0.05):
            if time.monotonic() > deadline:
                raise ConnectError(
                    f"IAP tunnel to {instance} not listening after {self.timeout:.0f}s",
                    hint=ROLE_HINT,
                )
        if not local:
            proc.wait(timeout=5)
            raise _tunnel_error(instance, [ln for ln in lines if ln])
        return local[0]

    def close(self) -> None:
        with self._lock:
            procs, self.procs = self.procs, []
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _tunnel_error(instance: str, lines: list[str]) -> Exception:
    """gcloud's own words, the last line; IAP's 4033 (not authorised) names the role."""
    last = lines[-1] if lines else "gcloud exited without a message"
    text = " ".join(lines)
    if "4033" in text or "not authorized" in text.lower():
        return PermissionDeniedError(f"IAP refused the tunnel to {instance}: {last}", hint=ROLE_HINT)
    if "4003" in text or "failed to connect to backend" in text.lower():
        return ConnectError(
            f"IAP tunnel to {instance}: {last}",
            hint="allow ingress from 35.235.240.0/20 to tcp:22 in the VM's VPC firewall",
        )
    return ConnectError(
        f"IAP tunnel to {instance} failed: {last}", hint="run the same gcloud command by hand"
    )
