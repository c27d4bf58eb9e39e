"""One TPU VM of either API, by its kind (a Cloud TPU node, a Compute Engine instance, a MIG slice): get it
again, wait for a state, delete it, rewrite its metadata."""

from __future__ import annotations

import time

from tpuops.cloud import tpu_api
from tpuops.cloud.client import Api, ApiNotFoundError
from tpuops.cloud.tpu_api import VmInfo
from tpuops.errors import CommandTimeoutError, PreemptedError

KINDS = ("node", "instance", "mig")


def get_vm(api: Api, zone: str, name: str, kind: str) -> VmInfo:
    if kind == "node":
        return tpu_api.get_vm(api, zone, name)
    from tpuops.cloud import compute_api

    return compute_api.get_vm(api, zone, name, kind)


def refresh(api: Api, vm: VmInfo) -> VmInfo:
    return get_vm(api, vm.zone, vm.name, vm.kind)


class _NotYetError(Exception):
    """The VM is not in the wanted state yet (retried by google.api_core's Retry)."""

    def __init__(self, state: str) -> None:
        super().__init__(state)
        self.state = state


def wait_state(api: Api, zone: str, name: str, kind: str, state: str, timeout: float) -> VmInfo | None:
    """Poll until the VM (of either API) is in `state` (DELETED: gone), saying each change; PREEMPTED ends a
    wait for READY. google.api_core's Retry does the polling (backoff 0.05 s x1.5 up to 5 s, bounded by
    `timeout`); the error names the state last seen."""
    from google.api_core import exceptions as gexc
    from google.api_core import retry as gretry

    start, seen = time.monotonic(), [""]

    def poll() -> VmInfo | None:
        try:
            vm: VmInfo | None = get_vm(api, zone, name, kind)
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


def delete_vm(api: Api, vm: VmInfo, timeout: float) -> None:
    if vm.kind == "node":
        tpu_api.delete_vm(api, vm.zone, vm.name, timeout)
        return
    from tpuops.cloud import compute_api

    compute_api.delete_vm(api, vm, timeout)


def update_metadata(api: Api, vm: VmInfo, changes: dict[str, str]) -> None:
    """Set `changes` in the VM's metadata, every other key kept: a node's in one update; on Compute Engine each
    instance's own (every worker of a MIG), each with its fingerprint."""
    if vm.kind == "node":
        tpu_api.update_metadata(api, vm, {**vm.metadata, **changes})
        return
    from concurrent.futures import ThreadPoolExecutor

    from tpuops.cloud import compute_api

    def one(i: int) -> None:
        compute_api.set_metadata(api, vm, i, {**vm.instance_metadata[i], **changes})

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(vm.instances)))) as pool:
        list(pool.map(one, range(len(vm.instances))))
