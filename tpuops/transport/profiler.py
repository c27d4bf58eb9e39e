"""A JAX profiler server on a worker, reached through a local tunnel: its Profile RPC asked for a capture.

The server (`jax.profiler.start_server(PORT)` in the job) writes the capture on the worker, as
`<repository_root>/<session>/<host>.xplane.pb`; the caller fetches it. The request is a few protobuf fields,
written here by hand (tsl/profiler/protobuf/profiler_service.proto, profiler_options.proto): no generated code.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

PROFILE_METHOD = "/tensorflow.ProfilerService/Profile"


class ProfilerUnreachableError(OSError):
    """Nothing listens on the worker's profiler port (or the worker cannot be reached)."""


class Duplex(Protocol):
    """What a tunnel's far end is: a socket, or a paramiko channel."""

    def send(self, data: bytes) -> int: ...
    def recv(self, size: int) -> bytes: ...
    def close(self) -> None: ...


OpenTcp = Callable[[int], Duplex]  # port on the worker's loopback -> a connection to it


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _int(num: int, value: int) -> bytes:
    return _varint(num << 3) + _varint(value)


def _bytes(num: int, value: bytes | str) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return _varint(num << 3 | 2) + _varint(len(raw)) + raw


def profile_request(duration_ms: int, repository_root: str, session: str, host: str) -> bytes:
    """ProfileRequest: duration, the options (version 1: honoured as given; host tracer 2, device tracer 1,
    no Python tracer: its events would swamp the ops), where the server writes the trace and under which name."""
    options = _int(5, 1) + _int(2, 2) + _int(3, 1) + _int(4, 0) + _int(9, duration_ms)
    return (
        _int(1, duration_ms)
        + _int(2, 1_000_000)  # max_events
        + _bytes(4, options)
        + _bytes(5, repository_root)
        + _bytes(6, session)
        + _bytes(7, host)
    )


def _pump(src: Duplex, dst: Duplex) -> None:
    try:
        while data := src.recv(65536):
            while data:
                data = data[dst.send(data) :]
    except OSError:
        pass
    finally:
        for end in (src, dst):
            with contextlib.suppress(OSError, EOFError):
                end.close()


@contextlib.contextmanager
def tunnel(open_tcp: OpenTcp, port: int) -> Iterator[int]:
    """A port on this machine's loopback whose connections reach `port` on the worker (through `open_tcp`).
    One connection is opened first, so that a closed port is said at once (ProfilerUnreachableError)."""
    try:
        open_tcp(port).close()
    except (OSError, EOFError) as e:
        raise ProfilerUnreachableError(str(e) or type(e).__name__) from None
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                near, _ = listener.accept()
            except OSError:
                return
            try:
                far = open_tcp(port)
            except (OSError, EOFError):
                near.close()
                continue
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


def capture(local_port: int, request: bytes, timeout_s: float) -> bytes:
    """Call Profile on the server behind `local_port`; returns the raw ProfileResponse. grpc.RpcError when the
    server refuses or the call does not finish in `timeout_s`."""
    import grpc  # imported here: the CLI starts without it

    with grpc.insecure_channel(f"127.0.0.1:{local_port}") as channel:
        call = channel.unary_unary(
            PROFILE_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        return bytes(call(request, timeout=timeout_s))
