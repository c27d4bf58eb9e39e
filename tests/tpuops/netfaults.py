"""A loopback TCP proxy that delays every chunk (network latency), swallows connections (a black hole) or cuts
them."""

from __future__ import annotations

import socket
import threading
import time


class DelayProxy:
    """127.0.0.1:<port> -> 127.0.0.1:<upstream>, each chunk held `delay_s` in each direction."""

    def __init__(self, upstream: int, delay_s: float = 0.0, blackhole: bool = False) -> None:
        self.upstream, self.delay_s, self.blackhole = upstream, delay_s, blackhole
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.closed = False
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.conns.append(client)
            if self.blackhole:
                continue  # accepted, never answered: the SSH banner never comes
            up = socket.create_connection(("127.0.0.1", self.upstream))
            self.conns.append(up)
            for a, b in ((client, up), (up, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.delay_s:
                    time.sleep(self.delay_s)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        """Every connection through the proxy ends at once, as a network cut would (the client sees EOF)."""
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.closed = True
        self.server.close()
        for c in self.conns:
            c.close()
