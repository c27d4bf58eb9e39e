"""Each emulated worker's metadata server: `instance/preempted` and `instance/maintenance-event` as Compute Engine
serves them (ETag, `?wait_for_change=true`, the `Metadata-Flavor: Google` header), on its own 127.0.0.1 port.

A worker's sessions find theirs through `GCE_METADATA_HOST` (sshd's SetEnv, as google-auth and tpuops' notice
watcher read it). `tpuops emulator fault preempt NAME --notice S` sets `preempted` to TRUE on every worker of the VM,
then preempts it S seconds later, as Compute Engine announces a Spot VM's preemption before it stops it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

ROOT = "/computeMetadata/v1/instance/"
DEFAULTS = {"preempted": "FALSE", "maintenance-event": "NONE"}
GUEST = (
    "guest-attributes/"  # PUT guest-attributes/NAMESPACE/KEY: what the guest publishes (the API serves it)
)
# The VM's service-account token, as Compute Engine serves it; the emulator's API asks for no credential.
TOKEN_KEY = "service-accounts/default/token"
TOKEN = '{"access_token": "emulator-token", "expires_in": 3599, "token_type": "Bearer"}'
MAX_WAIT_S = 300.0  # a wait_for_change without timeout_sec is answered (unchanged) after this long


class MetadataServer:
    """One worker's metadata: its values, each with an ETag, and the waiters for a change."""

    def __init__(self) -> None:
        self.values = dict(DEFAULTS)
        self.guest: dict[tuple[str, str], str] = {}  # (namespace, key) -> value, put by the worker
        self.changed = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.metadata = self  # type: ignore[attr-defined]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def host(self) -> str:
        """`127.0.0.1:PORT`: the worker's GCE_METADATA_HOST."""
        return f"127.0.0.1:{self._server.server_address[1]}"

    def set(self, key: str, value: str) -> None:
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def reset(self) -> None:
        with self.changed:
            self.values = dict(DEFAULTS)
            self.guest = {}
            self.changed.notify_all()

    def read(self, key: str, last_etag: str | None, wait_s: float | None) -> tuple[str, str] | None:
        """(value, etag); with `wait_s`, once the ETag differs from `last_etag` (the current value when it already
        does), or unchanged after `wait_s`. None: no such key."""
        deadline = time.monotonic() + (wait_s or 0.0)
        with self.changed:
            while True:
                if key not in self.values:
                    return None
                value = self.values[key]
                tag = etag(value)
                left = deadline - time.monotonic()
                if wait_s is None or tag != last_etag or left <= 0:
                    return value, tag
                self.changed.wait(left)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        md: MetadataServer = self.server.metadata  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if self.headers.get("Metadata-Flavor") != "Google":  # as Compute Engine: the header is required
            self._send(403, "Missing required header: Metadata-Flavor\n", None)
            return
        key = url.path.removeprefix(ROOT) if url.path.startswith(ROOT) else None
        wait = None
        if q.get("wait_for_change", "").lower() == "true":
            wait = min(float(q.get("timeout_sec", MAX_WAIT_S)), MAX_WAIT_S)
        if key == TOKEN_KEY:
            self._send(200, TOKEN, None)
            return
        found = md.read(key, q.get("last_etag"), wait) if key else None
        if found is None:
            self._send(404, "Not Found\n", None)
            return
        self._send(200, found[0], found[1])

    def do_PUT(self) -> None:
        """A guest attribute, as the guest agent and `curl -X PUT .../guest-attributes/NS/KEY` set them."""
        md: MetadataServer = self.server.metadata  # type: ignore[attr-defined]
        path = urlsplit(self.path).path
        value = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode(errors="replace")
        parts = path.removeprefix(ROOT + GUEST).split("/") if path.startswith(ROOT + GUEST) else []
        if self.headers.get("Metadata-Flavor") != "Google" or len(parts) != 2 or not all(parts):
            self._send(403 if parts else 404, "Not Found\n", None)
            return
        with md.changed:
            md.guest[(parts[0], parts[1])] = value
        self._send(200, "", None)

    def _send(self, code: int, text: str, tag: str | None) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        if tag:
            self.send_header("ETag", tag)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


_lock = threading.Lock()
_servers: dict[Path, MetadataServer] = {}  # a worker's state directory -> its metadata server


def serve(directory: Path) -> MetadataServer:
    """The metadata server of the worker whose sshd lives in `directory`, fresh (a recreated VM's worker gets the
    same server back, its values reset)."""
    with _lock:
        md = _servers.get(directory)
        if md is None:
            md = _servers[directory] = MetadataServer()
        else:
            md.reset()
        return md


def of(directory: Path) -> MetadataServer | None:
    with _lock:
        return _servers.get(directory)


def guest_items(directory: Path) -> list[dict[str, str]]:
    """The guest attributes the worker whose sshd lives in `directory` has put, as the API lists them."""
    md = of(directory)
    if md is None:
        return []
    with md.changed:
        return [{"namespace": ns, "key": k, "value": v} for (ns, k), v in sorted(md.guest.items())]


def announce(directories: list[Path], key: str, value: str) -> None:
    """Set one key on each of these workers' metadata servers (those that have one)."""
    for d in directories:
        md = of(d)
        if md is not None:
            md.set(key, value)


def after(seconds: float, action: Callable[[], None]) -> threading.Thread:
    """Run `action` in the background `seconds` from now (a preemption after its notice)."""

    def later() -> None:
        time.sleep(seconds)
        action()

    t = threading.Thread(target=later, daemon=True)
    t.start()
    return t


def stop_under(root: Path) -> None:
    """Stop the metadata servers of the workers under `root` (one emulator's state directory)."""
    with _lock:
        mine = [d for d in _servers if d.is_relative_to(root)]
        servers = [_servers.pop(d) for d in mine]
    for md in servers:
        md.close()
