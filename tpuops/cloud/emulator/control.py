"""Run the emulator in the foreground (`tpuops emulator serve`) and send it faults over /admin/*."""

from __future__ import annotations

import json
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpuops.cloud.emulator.server import DEFAULT_ZONES, Emulator
from tpuops.cloud.emulator.sshd import client_keypair, sshd_available
from tpuops.errors import CloudError, UsageError


def serve(
    state_dir: Path,
    *,
    port: int,
    zones: list[str] | None,
    authorized_key_file: str | None,
    create_delay: float,
    faults: dict[str, Any],
    verbose: bool,
    on_ready: Callable[[str, str, list[str]], None],
    on_stop: Callable[[str], None] | None = None,
) -> None:
    """Start, call on_ready(url, identity, zones), block until Ctrl-C or SIGTERM, then stop every sshd (on_stop
    hears what is being cleaned up first: the teardown takes seconds per VM)."""
    if not sshd_available():
        raise UsageError(
            "the emulator needs OpenSSH's sshd and ssh-keygen", hint="apt-get install openssh-server"
        )
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o755)  # sshd (as each worker's user) reads per-worker files below it
    identity, public = client_keypair(state_dir / "client")
    if authorized_key_file:
        public = Path(authorized_key_file).expanduser().read_text().strip()
    emu = Emulator(
        state_dir,
        port=port,
        zones=zones or DEFAULT_ZONES,
        authorized_key=public,
        create_delay=create_delay,
        verbose=verbose,
    )
    try:
        url = emu.start()
    except OSError as e:
        raise UsageError(
            f"cannot listen on 127.0.0.1:{port}: {e.strerror}", hint="pick another --port"
        ) from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if faults:
            emu.admin("faults", **faults)
        on_ready(url, str(identity), emu.model.zones)
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        if on_stop is not None:
            m = emu.model
            vms = len(m.nodes) + (
                len(getattr(m.compute, "instances", {}) or {}) if m.compute is not None else 0
            )
            users = len(m.created)
            on_stop(f"stopping: the API server, {vms} VM{'s' * (vms != 1)} and their sshd workers, {users} worker "
                    f"user{'s' * (users != 1)} and their homes (state kept in {state_dir})")  # fmt: skip
        emu.stop()


def admin(url: str | None, action: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST one fault (or `state`) to a running emulator; returns its state summary."""
    if not url:
        raise UsageError("no emulator endpoint", hint="pass --api-endpoint or export TPUOPS_TPU_API")
    req = urllib.request.Request(
        f"{url.rstrip('/')}/admin/{action}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise CloudError(
            f"emulator {action}: {json.loads(e.read()).get('error', {}).get('message', e)}"
        ) from None
    except urllib.error.URLError as e:
        raise CloudError(
            f"emulator at {url} unreachable: {e.reason}", hint="is `tpuops emulator serve` running?"
        ) from None
