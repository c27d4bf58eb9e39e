"""Waiting for a VM of any backend to reach a state, by polling its `get` (google.api_core's Retry)."""

from __future__ import annotations

import time
from collections.abc import Callable

from tpuops.cloud.client import Api, ApiNotFoundError
from tpuops.cloud.tpu_api import VmInfo
from tpuops.errors import CommandTimeoutError, PreemptedError


class _NotYetError(Exception):
    """The VM is not in the wanted state yet (retried by google.api_core's Retry)."""

    def __init__(self, state: str) -> None:
        super().__init__(state)
        self.state = state


def wait_for(
    api: Api, zone: str, name: str, get: Callable[[], VmInfo], state: str, timeout: float
) -> VmInfo | None:
    """Poll until the VM (of either API) is in `state` (DELETED: gone), saying each change; PREEMPTED ends a
    wait for READY. google.api_core's Retry does the polling (backoff 0.05 s x1.5 up to 5 s, bounded by
    `timeout`); the error names the state last seen."""
    from google.api_core import exceptions as gexc
    from google.api_core import retry as gretry

    start, seen = time.monotonic(), [""]

    def poll() -> VmInfo | None:
        try:
            vm: VmInfo | None = get()
        except ApiNotFoundError:
            if state != "DELETED":
                raise
            vm = None
        now = vm.state if vm else "DELETED"
        if now != seen[0]:
            api.notify(f"{name}: {now} after {time.monotonic() - start:.1f}s")
            seen[0] = now
        if now == state:
            return vm
        if now == "PREEMPTED" and state == "READY":
            raise PreemptedError(
                f"{name} in {zone} was preempted",
                hint=f"recreate it: tpuops vm delete {name} && tpuops vm create {name} ...",
            )
        raise _NotYetError(now)

    retry = gretry.Retry(
        predicate=gretry.if_exception_type(_NotYetError),
        initial=0.05,
        multiplier=1.5,
        maximum=5.0,
        timeout=timeout,
    )
    try:
        return retry(poll)()
    except gexc.RetryError:
        raise CommandTimeoutError(
            f"{name} still {seen[0]} after {timeout:.0f}s (waiting for {state})"
        ) from None
