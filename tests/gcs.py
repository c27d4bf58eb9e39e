"""A local GCS-compatible server (gcp-storage-emulator, in memory) for gs:// checkpoint tests."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager

BUCKET = "tpuops-ckpt"


@contextmanager
def gcs_server(bucket: str = BUCKET) -> Iterator[str]:
    """Serve GCS's JSON API on a free loopback port with `bucket` made; yields the URL that
    STORAGE_EMULATOR_HOST takes (the trainer also points tensorstore at it)."""
    from gcp_storage_emulator.server import create_server

    logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)  # "not found" probes are expected
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
