"""The google-cloud-tpu v2 client over REST: project, credentials, endpoint, bounded retries on 429/503, a
timeout on every try and a deadline on every call; each answer checked (cloud/answers.py)."""

from __future__ import annotations

import configparser
import functools
import itertools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict, TypeVar

from tpuops.cloud.answers import IDEMPOTENT, api_words, call_limits, failure, guard, one_line, transient_reads
from tpuops.errors import CloudError, PermissionDeniedError, UsageError

if TYPE_CHECKING:
    from google.api_core.client_options import ClientOptions
    from google.api_core.retry import Retry
    from google.auth.credentials import Credentials
    from google.cloud.tpu_v2 import TpuClient

T = TypeVar("T")
MAX_BACKOFF_S = 8.0  # the longest wait between two retries of a TPU API call
EMULATOR_PROJECT = "tpuops-emulator"  # used with --api-endpoint when no project is configured anywhere
Notify = Callable[[str], None]


def gcloud_config_value(section: str, key: str) -> str | None:
    """A value of gcloud's active configuration file (read, never by running gcloud)."""
    root = Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    active = root / "active_config"
    name = active.read_text().strip() if active.is_file() else "default"
    parser = configparser.ConfigParser()
    try:
        parser.read(root / "configurations" / f"config_{name or 'default'}")
    except configparser.Error:
        return None
    return parser.get(section, key, fallback=None) or None


def gcloud_config_project() -> str | None:
    """gcloud's own `core/project` from its active configuration file."""
    return gcloud_config_value("core", "project")


def resolve_project(flag: str | None, endpoint: str | None) -> tuple[str, str]:
    """(project, where it came from): --project/config, then the environment, then gcloud's config file; a
    malformed id from the environment or gcloud's file is exit 2 naming where it came from, before any call
    (the flag and tpuops.toml are checked where they are read: cli/options.py, config/settings.py)."""
    from tpuops.config.validators import name

    if flag:
        return flag, "--project or tpuops config"
    for var in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        if os.environ.get(var):
            return name("project", os.environ[var], var) or "", var
    project = gcloud_config_project()
    if project:
        return name("project", project, "gcloud config's core/project") or project, "gcloud config"
    if endpoint:
        return EMULATOR_PROJECT, "emulator default"
    raise UsageError(
        "no Google Cloud project: none given and none configured",
        hint="pass --project, set it in tpuops.toml, export GOOGLE_CLOUD_PROJECT, or run gcloud config set",
    )


class ApiNotFoundError(CloudError):
    """The API answered 404 for this resource (callers turn it into "not found, did you mean ...")."""


def _transient() -> tuple[type[Exception], ...]:
    import requests
    from google.api_core import exceptions as gexc

    return (gexc.ServiceUnavailable, gexc.TooManyRequests, gexc.GatewayTimeout, requests.ConnectionError)


@dataclass
class Api:
    """One TPU API client for one project, with a retrying `call`. Build it with `connect()`."""

    client: TpuClient  # imported lazily (~0.9 s)
    project: str
    endpoint: str | None = None
    notify: Notify = field(default=lambda _msg: None)
    retries: int = 5
    backoff_s: float = 0.2
    timeout_s: float = 30.0  # one try's wait for its answer (TPUOPS_API_TIMEOUT)
    deadline_s: float = 120.0  # a call with its retries (api_core's Retry deadline)
    client_id: str = ""  # which TpuClient of this process (the emulator's request log counts them)
    purpose: str = ""  # why these calls are made: "watch" for the recovery watch's polls, else ""

    def parent(self, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}"

    def for_purpose(self, purpose: str) -> Api:
        """The same client (no new connection pool), its calls marked with `purpose` in the emulator's log."""
        return replace(self, purpose=purpose)

    def metadata(self) -> list[tuple[str, str]]:
        """Request headers that tell the emulator which client made a call and why. Sent to a custom endpoint
        only: tpu.googleapis.com has no use for them."""
        if not self.endpoint:
            return []
        marks = [("x-tpuops-client", self.client_id)]
        return [*marks, ("x-tpuops-purpose", self.purpose)] if self.purpose else marks

    def host(self, service: str = "TPU API") -> str:
        """Where the calls go, as a line names it (no scheme, no path)."""
        if self.endpoint:
            return re.sub(r"^[a-z]+://", "", self.endpoint).split("/", 1)[0]
        return "compute.googleapis.com" if service == "Compute API" else "tpu.googleapis.com"

    def retry(self, what: str, service: str = "TPU API") -> Retry:
        """google.api_core's Retry for one call: exponential backoff with jitter on 429/503/504 and refused
        connections, and for a call that only reads (`answers.IDEMPOTENT`) on a try without an answer in
        `timeout_s`, a cut connection and 502 too; at most `retries` retries, each said through `notify` (its
        `on_error`), all within `deadline_s`; the one after the last is a CloudError."""
        from google.api_core import retry as gretry

        tries = itertools.count(1)
        host = self.host(service)
        retried = _transient() + (transient_reads() if what.startswith(IDEMPOTENT) else ())

        def on_error(e: Exception) -> None:
            k = next(tries)
            if k > self.retries:
                raise CloudError(
                    f"{service} {what}: still failing after {self.retries} retries: {short_error(e, self)}",
                    hint=f"{self.endpoint or host} is unavailable; try again later",
                )
            cap = min(MAX_BACKOFF_S, self.backoff_s * 2 ** (k - 1))  # the library draws the delay below it
            self.notify(
                f"{service} {what}: {short_error(e, self)}; retry {k}/{self.retries} in up to {cap:.1f}s"
            )

        return gretry.Retry(
            predicate=gretry.if_exception_type(*retried),
            initial=self.backoff_s,
            multiplier=2.0,
            maximum=MAX_BACKOFF_S,
            timeout=self.deadline_s,
            on_error=on_error,
        )

    def call(self, what: str, fn: Callable[..., T], /, **kw: object) -> T:
        """`fn(**kw, retry=..., timeout=..., metadata=...)` with `retry(what)`; every other failure becomes a
        CloudError of one line (a permission error names the role it needs; `answers.failure`: a web page, cut
        JSON, no answer in time)."""
        try:
            return fn(**kw, retry=self.retry(what), timeout=self.timeout_s, metadata=self.metadata())
        except CloudError:
            raise
        except Exception as e:
            raise api_error(what, e, self) from None

    def zones(self) -> list[str]:
        """Every location of the TPU API for this project (one call; the zone search fans out over these)."""
        from google.cloud.location import locations_pb2

        req = locations_pb2.ListLocationsRequest(name=f"projects/{self.project}")
        resp = self.call("list zones", self.client.list_locations, request=req)
        return sorted(loc.location_id for loc in resp.locations)


def api_error(what: str, e: Exception, api: Api | None = None) -> CloudError:
    """An API exception -> a TpuopsError with a next step; anything else (a web page, cut JSON, no answer in
    time, a cut connection) -> `answers.failure`'s one line."""
    from google.api_core import exceptions as gexc

    if isinstance(e, gexc.NotFound):
        return ApiNotFoundError(f"TPU API {what}: not found: {_message(e)}")
    if isinstance(e, gexc.PermissionDenied | gexc.Forbidden):
        return PermissionDeniedError(
            f"TPU API {what}: permission denied: {short_error(e)}", hint=_role_hint(what)
        )
    if isinstance(e, gexc.Unauthenticated):
        return CloudError(
            f"TPU API {what}: {_message(e)}",
            hint="check the project and `gcloud auth application-default login`",
        )
    if isinstance(e, gexc.ResourceExhausted):
        return CloudError(
            f"TPU API {what}: capacity or quota exhausted: {_message(e)}",
            hint="try another zone (--zone, repeatable)",
        )
    if isinstance(e, gexc.GoogleAPICallError):
        return CloudError(f"TPU API {what}: {e.code} {_message(e)}", hint=page_hint(e, api))
    return failure("TPU API", what, e, *limits_of(api))


def limits_of(api: Api | None, service: str = "TPU API") -> tuple[str, tuple[float, float]]:
    """(the host a line names, the (per-try timeout, deadline) of `api`'s calls)."""
    if api is None:
        return ("compute.googleapis.com" if service == "Compute API" else "tpu.googleapis.com"), call_limits()
    return api.host(service), (api.timeout_s, api.deadline_s)


def page_hint(e: Exception, api: Api | None, service: str = "TPU API") -> str | None:
    """An error status that came with a web page (a proxy's error page, not Google's JSON): say so."""
    text = str(getattr(e, "message", "") or "")
    if "<" not in text or not one_line(text).startswith("an HTML page"):
        return None
    return f"a proxy or gateway between here and {limits_of(api, service)[0]} answered, not Google; try again"


# The TPU API calls that only read need roles/tpu.viewer; the others change nodes and need roles/tpu.admin.
_READS = ("list", "get", "guest attributes", "poll")


def _role_hint(what: str) -> str:
    if what.startswith(_READS):
        return "needs roles/tpu.viewer (or roles/tpu.admin) on the project; check the project too"
    return "needs roles/tpu.admin on the project (creating, deleting and changing TPU VMs)"


def _message(e: BaseException) -> str:
    """An API error's message as a line shows it (`answers.api_words`)."""
    return api_words(e)


def short_error(e: BaseException, api: Api | None = None) -> str:
    """An error in a few words: an API's status and message, else what `answers.failure` says of it."""
    from google.api_core import exceptions as gexc

    if isinstance(e, gexc.GoogleAPICallError):
        return f"{e.code} {_message(e)}".strip()
    if isinstance(e, Exception):
        return failure("", "", e, *limits_of(api)).message
    return type(e).__name__


def connect(project: str | None, endpoint: str | None, notify: Notify | None = None) -> Api:
    """An Api for `project` over this process's one TpuClient for `endpoint` (see `_client`)."""
    proj, _ = resolve_project(project, endpoint)
    timeout_s, deadline_s = call_limits()
    client, client_id = _client(endpoint)
    return Api(client, proj, endpoint, notify or (lambda _msg: None), timeout_s=timeout_s,
               deadline_s=deadline_s, client_id=client_id)  # fmt: skip


_built = itertools.count(1)


def credentials(endpoint: str | None) -> Credentials:
    """The credentials of every Google client tpuops builds: anonymous against a custom `endpoint` (the
    emulator), else Application Default Credentials (a CloudError naming the fix when there are none)."""
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    import google.auth
    import google.auth.exceptions

    try:
        creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except google.auth.exceptions.DefaultCredentialsError as e:
        raise CloudError(
            f"no Google credentials: {str(e).splitlines()[0]}",
            hint="run `gcloud auth application-default login`, or use the emulator with --api-endpoint",
        ) from None
    return creds


class ClientKwargs(TypedDict):
    """The keyword arguments every Google client class tpuops builds takes."""

    transport: str
    credentials: Credentials
    client_options: NotRequired[ClientOptions]


def client_kwargs(endpoint: str | None) -> ClientKwargs:
    """The keyword arguments of every Google client tpuops builds (TPU, Compute Engine, OS Login, billing):
    REST, `credentials(endpoint)`, and the endpoint itself when one is given."""
    kw: ClientKwargs = {"transport": "rest", "credentials": credentials(endpoint)}
    if endpoint:
        from google.api_core.client_options import ClientOptions

        kw["client_options"] = ClientOptions(api_endpoint=endpoint)
    return kw


def build(factory: Callable[..., T], endpoint: str | None) -> T:
    """One Google client class (`tpu_v2.TpuClient`, `compute_v1.InstancesClient`, ...) for `endpoint`: the
    one place that chooses between the emulator and real credentials; its every answer checked
    (`answers.guard`)."""
    return guard(factory(**client_kwargs(endpoint)))


@functools.cache
def _client(endpoint: str | None) -> tuple[TpuClient, str]:
    """A TPU API REST client, built once per process and endpoint (each holds its own credentials and
    connection pool). A failure is not cached: the next call tries again."""
    from google.cloud import tpu_v2

    client = build(tpu_v2.TpuClient, endpoint)
    # Its operations' polls (`Operation.result`) go through a client of their own, with its own session.
    guard(getattr(client._transport, "operations_client", None))
    return client, f"{os.getpid()}-{next(_built)}"
