"""The Compute Engine clients: google-cloud-compute's (REST) for every change and its operations, awaited with
the library's own helper (`ExtendedOperation.result`); reads as the REST API's JSON through an authorized
session (`read`), so listing and describing never import `google.cloud.compute_v1` (~1 s). Both retry with
the TPU client's `google.api_core.retry.Retry` and turn errors into one line; every answer is checked
(cloud/answers.py)."""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, cast

from tpuops.cloud.answers import failure, guard, guard_session
from tpuops.cloud.client import (
    Api,
    ApiNotFoundError,
    client_kwargs,
    credentials,
    limits_of,
    page_hint,
    short_error,
)
from tpuops.cloud.compute_json import AggregatedPage, Instance, InstancePage, ScopedList
from tpuops.errors import CloudError, CommandTimeoutError, PermissionDeniedError

if TYPE_CHECKING:
    import requests
    from google.api_core.extended_operation import ExtendedOperation
    from google.cloud import compute_v1

T = TypeVar("T")
COMPUTE_HOST = "https://compute.googleapis.com"


@dataclass(frozen=True)
class Clients:
    """The Compute Engine clients tpuops uses, built once per process and endpoint (one id for the log)."""

    instances: compute_v1.InstancesClient
    migs: compute_v1.InstanceGroupManagersClient
    templates: compute_v1.InstanceTemplatesClient
    policies: compute_v1.ResourcePoliciesClient
    client_id: str


_built = itertools.count(1)


@functools.cache
def client_id(endpoint: str | None) -> str:
    """This process's one id for its Compute Engine calls to `endpoint` (the emulator's request log counts
    clients): the library's clients and the REST reads share it."""
    return f"{os.getpid()}-c{next(_built)}"


@functools.cache
def _clients(endpoint: str | None) -> Clients:
    """REST clients (the only transport of google-cloud-compute): anonymous credentials against `endpoint`
    (the emulator), else Application Default Credentials against compute.googleapis.com. Imported here only:
    `google.cloud.compute_v1` costs ~1.4 s and no command that does not reach Compute Engine pays it."""
    from google.cloud import compute_v1

    kw = client_kwargs(endpoint)
    made = Clients(
        guard(compute_v1.InstancesClient(**kw)),
        guard(compute_v1.InstanceGroupManagersClient(**kw)),
        guard(compute_v1.InstanceTemplatesClient(**kw)),
        guard(compute_v1.ResourcePoliciesClient(**kw)),
        client_id=client_id(endpoint),
    )
    if endpoint:
        # The library builds the operations client that `operation.result()` polls with the credentials only,
        # never the client options (compute_v1/services/*/transports/base.py `_zone_operations_client`): it
        # would poll compute.googleapis.com. Hand each transport operations clients for the same endpoint.
        ops = {
            "zone_operations": guard(compute_v1.ZoneOperationsClient(**kw)),
            "region_operations": guard(compute_v1.RegionOperationsClient(**kw)),
            "global_operations": guard(compute_v1.GlobalOperationsClient(**kw)),
        }
        for transport in (
            made.instances._transport,
            made.migs._transport,
            made.templates._transport,
            made.policies._transport,
        ):
            getattr(transport, "_extended_operations_services", {}).update(ops)
    return made


def clients(api: Api) -> Clients:
    return _clients(api.endpoint)


def _headers(api: Api) -> list[tuple[str, str]]:
    """The emulator's request-log marks (custom endpoints only), with the Compute clients' own id."""
    if not api.endpoint:
        return []
    marks = [("x-tpuops-client", client_id(api.endpoint))]
    return [*marks, ("x-tpuops-purpose", api.purpose)] if api.purpose else marks


def call(api: Api, what: str, fn: Callable[..., T], /, **kw: object) -> T:
    """`fn(**kw)` with the same google.api_core Retry as the TPU API's (`Api.retry`: backoff with jitter on
    429/503/504 and refused connections, at most `api.retries` retries, each said through `notify`); other
    errors -> TpuopsError (a 403 names the Compute Engine role)."""
    try:
        return fn(**kw, retry=api.retry(what, "Compute API"), timeout=api.timeout_s, metadata=_headers(api))
    except CloudError:
        raise
    except Exception as e:
        raise compute_error(what, e, api) from None


# Calls that only read need a viewer role; the others change instances, templates, policies or groups.
_READS = ("get", "list", "search", "guest attributes", "poll")


def compute_error(what: str, e: Exception, api: Api | None = None) -> CloudError:
    """A Compute API exception -> a TpuopsError; a 403 names the role (as the TPU path does); anything else
    (a web page, cut JSON, no answer in time) -> `answers.failure`'s one line."""
    from google.api_core import exceptions as gexc

    if isinstance(e, gexc.NotFound):
        return ApiNotFoundError(f"Compute API {what}: not found: {short_error(e)}")
    if isinstance(e, gexc.PermissionDenied | gexc.Forbidden):
        hint = (
            "needs roles/compute.viewer (or roles/compute.instanceAdmin.v1) on the project; check the project too"
            if what.startswith(_READS)
            else "needs roles/compute.instanceAdmin.v1 on the project, and roles/iam.serviceAccountUser on the "
            "VMs' service account"
        )
        return PermissionDeniedError(f"Compute API {what}: permission denied: {short_error(e)}", hint=hint)
    if isinstance(e, gexc.GoogleAPICallError):
        return CloudError(f"Compute API {what}: {short_error(e)}", hint=page_hint(e, api, "Compute API"))
    return failure("Compute API", what, e, *limits_of(api, "Compute API"))


def wait_op(api: Api, op: ExtendedOperation, what: str, timeout: float) -> None:
    """Wait for a Compute operation with the library's own poller (`ExtendedOperation.result`), its backoff
    starting at 0.1 s instead of the default 1 s (x1.5 up to 20 s: most operations here take well under a
    second on the emulator and a few seconds on Google); an operation that finished with errors is an error
    even without an HTTP status (the library returns None for those)."""
    import concurrent.futures

    from google.api_core.future import polling

    try:
        op.result(timeout=timeout, polling=polling.DEFAULT_POLLING.with_delay(initial=0.1))
    except concurrent.futures.TimeoutError:
        raise CommandTimeoutError(
            f"{what}: operation {op.name} not done after {timeout:.0f}s",
            hint="it may still finish: check with `tpuops vm describe`",
        ) from None
    except CloudError:
        raise
    except Exception as e:
        detail = _op_errors(op)  # the operation's own errors[] (code, message) say more than its HTTP status
        if detail:
            raise CloudError(f"{what}: {detail}") from None
        raise compute_error(what, e, api) from None
    detail = _op_errors(op)
    if detail:
        raise CloudError(f"{what}: {detail}")


def _op_errors(op: ExtendedOperation) -> str:
    """`CODE message; ...` of a finished operation's `error.errors[]`, '' when it has none."""
    errors = getattr(getattr(op, "error", None), "errors", None) or []
    return "; ".join(f"{e.code} {e.message}".strip() for e in errors)


def capacity_error(e: CloudError) -> bool:
    """A stockout (the zone has no such TPUs now): try the next zone."""
    text = e.message
    return "RESOURCE_POOL_EXHAUSTED" in text or "does not have enough resources" in text


@functools.cache
def _session(endpoint: str | None) -> requests.Session:
    """One authorized requests session per process and endpoint (`client.credentials`: anonymous against the
    emulator, Application Default Credentials otherwise)."""
    from google.auth.transport.requests import AuthorizedSession

    return guard_session(AuthorizedSession(credentials(endpoint)))


def read(api: Api, what: str, path: str, params: dict[str, str] | None = None, method: str = "GET") -> object:
    """One Compute Engine read, `projects/P/` + `path`, as the REST API's JSON (the field names of
    cloud.google.com/compute/docs/reference/rest/v1; a JSON object, `answers.check` sees to that: callers
    cast it to its shape in compute_json), with the library's retry and the errors of `call`."""
    base = (api.endpoint or COMPUTE_HOST).rstrip("/")
    if "://" not in base:
        base = f"https://{base}"
    url = f"{base}/compute/v1/projects/{api.project}/{path}"
    headers = dict(_headers(api))

    def once() -> object:
        from google.api_core import exceptions as gexc

        resp = _session(api.endpoint).request(method, url, params=params or {}, headers=headers,
                                              timeout=api.timeout_s)  # fmt: skip
        if resp.status_code >= 400:
            raise gexc.from_http_response(resp)
        return resp.json()

    try:
        return api.retry(what, "Compute API")(once)()
    except CloudError:
        raise
    except Exception as e:
        raise compute_error(what, e, api) from None


def _pages(api: Api, what: str, path: str, params: dict[str, str] | None) -> Iterator[object]:
    """Every page of a list, following `nextPageToken`."""
    query = dict(params or {})
    while True:
        page = read(api, what, path, query)
        yield page
        token = cast(InstancePage, page).get("nextPageToken")
        if not token:
            return
        query["pageToken"] = token


def pages(api: Api, what: str, path: str, params: dict[str, str] | None = None) -> list[Instance]:
    """Every instance of an instances.list (`items` of every page)."""
    return [
        item for page in _pages(api, what, path, params) for item in cast(InstancePage, page).get("items", [])
    ]


def aggregated_pages(
    api: Api, what: str, path: str, params: dict[str, str] | None = None
) -> list[tuple[str, ScopedList]]:
    """(scope, its resources) of every page of an aggregatedList (`items` maps each scope to them)."""
    return [
        scope
        for page in _pages(api, what, path, params)
        for scope in cast(AggregatedPage, page).get("items", {}).items()
    ]
