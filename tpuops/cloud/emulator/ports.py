"""A port filtered between emulated workers: one worker's route to worker 0 ends, at that port, in a black hole.

Emulated workers all live on 127.0.0.1, where no firewall stands between them. A filter gives one worker its own
address for worker 0 (`peer-host` in the `tpuops-emulator` guest attributes, which locate reads only from an
emulator): another loopback address, where every port reaches worker 0's wildcard listeners as before but the
filtered one is held by a listener whose accept queue is full, so the kernel drops each SYN unanswered, as a
firewall's DROP rule does. Whatever connects there (tpuops' port check, jax.distributed) waits and times out."""

from __future__ import annotations

import itertools
import socket
import threading
from typing import Any

from tpuops.cloud.emulator.records import EMULATOR_NS

_lock = threading.Lock()
_next = itertools.count(1)
_filters: dict[str, dict[int, tuple[str, list[socket.socket]]]] = {}  # node -> worker -> (address, sockets)


def filter_port(node: str, worker: int, port: int) -> str:
    """From now on `worker` of `node` reaches worker 0's `port` nowhere; returns the address it now sees."""
    with _lock:
        n = next(_next)
        address = f"127.77.{n // 250}.{n % 250 + 1}"
        hole = socket.socket()
        hole.bind((address, port))
        hole.listen(0)  # the accept queue holds one connection ...
        filler = socket.create_connection((address, port), timeout=5)  # ... and here it is: the queue is full
        _filters.setdefault(node, {})[worker] = (address, [hole, filler])
        return address


def clear(node: str | None = None) -> None:
    """Lift the filters of one node (all of them with None)."""
    with _lock:
        for name in [node] if node is not None else list(_filters):
            for _, socks in _filters.pop(name, {}).values():
                for s in socks:
                    s.close()


def attributes(node: str, worker: int) -> list[dict[str, Any]]:
    """The worker's guest attribute naming its route to worker 0, when a filter gave it one."""
    with _lock:
        found = _filters.get(node, {}).get(worker)
    return [{"namespace": EMULATOR_NS, "key": "peer-host", "value": found[0]}] if found else []
