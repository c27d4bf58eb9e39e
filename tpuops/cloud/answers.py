"""Every Google API answer checked before a client library reads it (JSON, whole, an object), and the failures
no API status names (a web page in Google's place, JSON cut off, no answer in time, a cut connection) as one
line each, exit 6."""

from __future__ import annotations

import html
import json
import os
import re
from typing import TYPE_CHECKING, TypeVar

from tpuops.errors import CloudError, UsageError

if TYPE_CHECKING:
    import requests

C = TypeVar("C")

CALL_TIMEOUT_S = 30.0  # the longest one try of a Google API call waits for its answer (TPUOPS_API_TIMEOUT)
DEADLINE_TRIES = 4  # a call and its retries end within this many times that (api_core's Retry deadline)
TIMEOUT_ENV = "TPUOPS_API_TIMEOUT"
_LINE_MAX = 160  # the most characters of an API's own message a line carries


class BadAnswerError(Exception):
    """An answer with a 2xx status that is not the API's JSON; `detail` says what came instead."""

    def __init__(self, detail: str, *, page: bool, host: str) -> None:
        super().__init__(detail)
        self.detail, self.page, self.host = detail, page, host


def call_limits() -> tuple[float, float]:
    """(seconds one try waits for an answer, seconds a call and its retries may take): TPUOPS_API_TIMEOUT, else
    30 s; the deadline is DEADLINE_TRIES times that. A value that is no positive finite number is exit 2."""
    from tpuops.config.validators import number

    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return CALL_TIMEOUT_S, CALL_TIMEOUT_S * DEADLINE_TRIES
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{TIMEOUT_ENV} must be a number of seconds > 0, received {raw!r}") from None
    seconds = number(value, TIMEOUT_ENV)
    return seconds, seconds * DEADLINE_TRIES


def _title(body: bytes) -> str:
    m = re.search(rb"<title[^>]*>(.*?)</title>", body[:65536], re.I | re.S)
    return one_line(html.unescape(m[1].decode("utf-8", "replace")), 60) if m else ""


def is_page(body: bytes, content_type: str = "") -> bool:
    """A web page (HTML or XML markup), by its Content-Type or its first bytes."""
    head = body[:512].lstrip().lower()
    return "html" in content_type.lower() or head.startswith(
        (b"<!doctype", b"<html", b"<?xml", b"<head", b"<body")
    )


def page_words(body: bytes) -> str:
    title = _title(body)
    return f"an HTML page ({title!r})" if title else "an HTML page"


def check(resp: requests.Response, *args: object, **kwargs: object) -> None:
    """A requests response hook on every session of every Google client tpuops builds: a 2xx answer must be a
    JSON object, whole (an empty body passes: nothing is parsed from it). Error answers are left to api_core,
    which reads a non-JSON error body as its message (`one_line` makes that one line)."""
    if not 200 <= resp.status_code < 300 or not resp.content:
        return
    from urllib.parse import urlsplit

    host = urlsplit(resp.url).hostname or "the API"
    body = resp.content
    if is_page(body, resp.headers.get("Content-Type", "")):
        raise BadAnswerError(
            f"answered {page_words(body)} with HTTP {resp.status_code}, not the API's JSON",
            page=True,
            host=host,
        )
    try:
        data = json.loads(body)
    except ValueError as e:
        msg = getattr(e, "msg", str(e))
        where = (
            f"{'' if msg.endswith(' at') else ' at'} byte {e.pos:,}"
            if isinstance(e, json.JSONDecodeError)
            else ""
        )
        raise BadAnswerError(
            f"answered JSON that is cut off or damaged ({len(body):,} bytes): {msg}{where}",
            page=False,
            host=host,
        ) from None
    if not isinstance(data, dict):
        raise BadAnswerError(f"answered JSON {type(data).__name__}, not an object", page=False, host=host)


def guard_session(session: requests.Session) -> requests.Session:
    """`session` (a requests session) with `check` on every answer, once."""
    hooks = session.hooks.setdefault("response", [])
    if check not in hooks:
        hooks.append(check)
    return session


def guard(client: C) -> C:
    """A google-cloud REST client whose answers pass `check`: its transport's own requests session (the
    generated REST transports keep it as `_session`; a client without one is returned as it is)."""
    session = getattr(getattr(client, "_transport", None), "_session", None)
    if session is not None and hasattr(session, "hooks"):
        guard_session(session)
    return client


def one_line(text: str, limit: int = _LINE_MAX) -> str:
    """An API's own words as one line: a web page named by its title, whitespace folded, at most `limit`."""
    raw = text.encode("utf-8", "replace")
    if is_page(raw):
        return page_words(raw)
    words = " ".join(text.split())
    return words if len(words) <= limit else words[: limit - 3].rstrip() + "..."


def api_words(e: BaseException) -> str:
    """An API error's message without the REST transport's "GET http://...: " prefix (the method and URL add
    nothing, and a line never carries a URL the user did not give), as one line."""
    return one_line(re.sub(r"^[A-Z]+ \S+: ", "", str(getattr(e, "message", "") or "")))


def failure(service: str, what: str, e: BaseException, host: str, limits: tuple[float, float]) -> CloudError:
    """A failure of `service`'s call `what` that is no API status (those are `client.api_error`'s) -> one line.
    `limits`: the call's (per-try timeout, deadline)."""
    import requests
    from google.api_core import exceptions as gexc
    from google.protobuf import json_format

    timeout_s, deadline_s = limits

    def line(words: str) -> str:
        return f"{service} {what}: {words}" if service else words

    cause = e.cause if isinstance(e, gexc.RetryError) and e.cause is not None else e
    # A change whose answer was lost (cut, or none in time) may have been made all the same.
    made = "" if not what or what.startswith(IDEMPOTENT) else (
        "it may still have been done: look with `tpuops vm describe` before trying again; "
    )  # fmt: skip
    if isinstance(cause, BadAnswerError):
        hint = (
            f"something between here and {cause.host} answers in Google's place, a captive portal or a proxy: "
            "sign in to the network, or set HTTPS_PROXY / NO_PROXY"
            if cause.page
            else f"{made}the answer from {cause.host} was cut off or damaged on its way; try again, a proxy may cut it"
        )
        return CloudError(line(cause.detail), hint=hint)
    if isinstance(cause, requests.Timeout):
        if isinstance(e, gexc.RetryError):
            words = f"no answer within {deadline_s:g}s (each try waited {timeout_s:g}s)"
        else:
            words = f"no answer within {timeout_s:g}s"
        hint = f"{made}is {host} reachable from here? {TIMEOUT_ENV}=SECONDS sets the wait of each try"
        return CloudError(line(words), hint=hint)
    if isinstance(cause, requests.ConnectionError | requests.exceptions.ChunkedEncodingError):
        return CloudError(
            line(f"the connection to {host} failed or was cut: {type(cause).__name__}"),
            hint=f"{made}check the network (and HTTPS_PROXY); try again",
        )
    if isinstance(e, gexc.RetryError):
        said = (
            f"{cause.code} {api_words(cause)}" if isinstance(cause, gexc.GoogleAPICallError) else str(cause)
        )
        said = one_line(said)
        return CloudError(
            line(f"still failing after {deadline_s:g}s: {said}"),
            hint=f"{host} is unavailable; try again later",
        )
    if isinstance(cause, json_format.ParseError | ValueError):
        return CloudError(
            line(f"answered JSON that is not what the API returns: {one_line(str(cause))}"),
            hint=f"something between here and {host} changed the answer (a proxy?); try again",
        )
    from google.auth import exceptions as auth_exc

    if isinstance(cause, auth_exc.GoogleAuthError):
        return CloudError(
            line(f"credentials: {one_line(str(cause))}"), hint="run `gcloud auth application-default login`"
        )
    return CloudError(line(f"{type(cause).__name__}: {one_line(str(cause))}"))


# Calls that only read (their names start so): a timeout or a cut connection is tried again; a change is not
# (it may have been done: retrying a create would meet its own VM).
IDEMPOTENT = ("list", "get", "search", "guest attributes", "poll")


def transient_reads() -> tuple[type[Exception], ...]:
    """What is tried again on top of 429/503/504 and refused connections when the call only reads."""
    import requests
    from google.api_core import exceptions as gexc

    return (requests.Timeout, requests.exceptions.ChunkedEncodingError, gexc.BadGateway)
