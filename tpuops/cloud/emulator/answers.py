"""The emulator's broken answers: the next N calls of the TPU API or of Compute Engine get an HTML page (a captive
portal, or a proxy's error page), JSON cut off mid-way, or no answer at all (a hang)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

MODES = ("html", "truncated", "hang")
APIS = ("tpu", "compute")
HANG_MAX_S = 600.0  # a hung call is let go (its connection closed, nothing sent) after this long, or at stop

_PORTAL = (
    "<!DOCTYPE html>\n<html><head><title>Sign in to the network</title></head>\n<body>\n"
    "<h1>Welcome to the guest network</h1>\n<p>Please accept the terms of use to continue.</p>\n"
    '<form method="post" action="/login"><button>Accept</button></form>\n</body></html>\n'
)
_PROXY = (
    "<!DOCTYPE html>\n<html><head><title>{code} Proxy Error</title></head>\n<body>\n<h1>Proxy Error</h1>\n"
    "<p>The proxy server received an invalid response from an upstream server.</p>\n</body></html>\n"
)


def api_of(path: str) -> str | None:
    """Which API a request path belongs to: "tpu", "compute", or None (OS Login, IAP, billing: never broken)."""
    if path.startswith("/v2/"):
        return "tpu"
    if path.startswith("/compute/v1/"):
        return "compute"
    return None


@dataclass
class BrokenAnswers:
    """Per API: (mode, calls still to break, the HTTP status an HTML page comes with)."""

    pending: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    released: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, api: str, mode: str, count: int, code: int = 200) -> None:
        """Break the next `count` calls of `api` ("tpu", "compute" or "all") with `mode`; 0 clears it."""
        if mode not in MODES:
            raise ValueError(f"answer mode {mode!r} is not one of {', '.join(MODES)}")
        apis = APIS if api == "all" else (api,)
        if any(a not in APIS for a in apis):
            raise ValueError(f"api {api!r} is not one of tpu, compute, all")
        with self.lock:
            for a in apis:
                if count > 0:
                    self.pending[a] = (mode, count, code)
                else:
                    self.pending.pop(a, None)
        self.released.clear()

    def take(self, path: str) -> tuple[str, int] | None:
        """(mode, code) when this call is to be broken (one of the N counted down), else None."""
        api = api_of(path)
        with self.lock:
            if api not in self.pending:
                return None
            mode, left, code = self.pending[api]
            if left <= 1:
                del self.pending[api]
            else:
                self.pending[api] = (mode, left - 1, code)
            return mode, code

    def clear(self) -> None:
        """No broken answers pending, and every hung call let go."""
        with self.lock:
            self.pending.clear()
        self.released.set()

    def summary(self) -> dict[str, dict[str, int | str]]:
        with self.lock:
            return {a: {"mode": m, "count": n, "code": c} for a, (m, n, c) in self.pending.items()}


def send(handler: BaseHTTPRequestHandler, broken: BrokenAnswers, mode: str, code: int, answer: bytes) -> None:
    """Answer `handler`'s request the broken way `mode` says (`answer`: the JSON it would have sent)."""
    if mode == "hang":  # read, never answered: the client's own timeout is all that ends the call
        broken.released.wait(HANG_MAX_S)
        handler.close_connection = True
        return
    if mode == "html":
        body = (_PORTAL if code < 400 else _PROXY.format(code=code)).encode()
        kind = "text/html; charset=utf-8"
    else:  # truncated: a well-formed HTTP answer whose JSON stops half-way
        body, kind = answer[: max(1, len(answer) // 2)], "application/json; charset=UTF-8"
    handler.send_response(code if mode == "html" else 200)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
