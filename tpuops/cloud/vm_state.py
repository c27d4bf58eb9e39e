"""One TPU VM of any backend (tpuops.cloud.backends picks it by the VM's kind): find it in a zone, list every
kind, get it again, wait for a state, delete it, rewrite its metadata, tell whether it is lost, recreate it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from tpuops.cloud.backends import REGISTRY, Listing, backend_of, by_kind
from tpuops.cloud.client import Api, ApiNotFoundError
from tpuops.cloud.tpu_api import VmInfo
from tpuops.cloud.waits import wait_for
from tpuops.errors import CloudError, PermissionDeniedError

if TYPE_CHECKING:
    from tpuops.config import TargetSpec

KINDS = tuple(REGISTRY)
# States in which a VM's workers are gone for good. (STOPPED is left alone: someone chose it.)
LOST_STATES = ("PREEMPTED", "TERMINATED")


def get_vm(api: Api, zone: str, name: str, kind: str) -> VmInfo:
    return by_kind(kind).get(api, zone, name)


def refresh(api: Api, vm: VmInfo) -> VmInfo:
    return get_vm(api, vm.zone, vm.name, vm.kind)


def find_in_zone(api: Api, zone: str, name: str, first: str | None) -> VmInfo | None:
    """The VM `name` in `zone`, asking each backend in the registry's order (the cached kind first): one get
    per backend at most. A refused API (disabled, no role) does not hide a VM of another API."""
    denied: PermissionDeniedError | None = None
    for kind in sorted(REGISTRY, key=lambda k: k != first):
        try:
            return by_kind(kind).get(api, zone, name)
        except ApiNotFoundError:
            continue
        except PermissionDeniedError as e:
            denied = denied or e
    if denied:
        raise denied
    return None


def _each(api: Api, listing: Listing, ask: str, name: str = "") -> tuple[list[VmInfo], list[CloudError]]:
    """Every backend's `list` (or `find` of `name`) at once; (VMs, the errors of the backends that failed)."""

    def one(kind: str) -> list[VmInfo]:
        b = by_kind(kind)
        return b.find(api, name, listing) if ask == "find" else b.list_vms(api, listing)

    found: list[VmInfo] = []
    errors: list[CloudError] = []
    with ThreadPoolExecutor(max_workers=len(REGISTRY)) as pool:
        for fut in [pool.submit(one, k) for k in REGISTRY]:
            try:
                found += fut.result()
            except CloudError as e:
                if all(e is not seen for seen in errors):  # backends sharing one API share its error
                    errors.append(e)
    return found, errors


def list_all(
    api: Api, zones: list[str], listing: Listing | None = None
) -> tuple[list[VmInfo], list[str], list[CloudError]]:
    """(every backend's VMs in `zones` (every zone when empty), the zones the Cloud TPU API was asked, the
    errors of the APIs that failed). A multislice is one VM with its slices. `listing`: answers already had."""
    listing = listing or Listing(zones)
    found, errors = _each(api, listing, "list")
    return sorted(found, key=lambda v: (v.zone, v.name)), listing.searched, errors


def broken(errors: list[CloudError]) -> list[CloudError]:
    """The errors of APIs that did not answer as an API does (a web page, cut JSON, nothing in time, a 5xx):
    what they hold is unknown, not absent. A refusal (403: no role, the API disabled) or a 404 is not one."""
    return [e for e in errors if not isinstance(e, PermissionDeniedError | ApiNotFoundError)]


def search(api: Api, name: str, listing: Listing) -> tuple[list[VmInfo], list[CloudError]]:
    """(VMs named `name` in any zone, the errors of the APIs that failed): every backend's `find` at once."""
    return _each(api, listing, "find", name)


def wait_state(api: Api, zone: str, name: str, kind: str, state: str, timeout: float) -> VmInfo | None:
    """Poll until the VM (of any backend) is in `state` (DELETED: gone); see `backends.base.wait_for`."""
    backend = by_kind(kind)
    return wait_for(api, zone, name, lambda: backend.get(api, zone, name), state, timeout)


def delete_vm(api: Api, vm: VmInfo, timeout: float) -> None:
    backend_of(vm).delete(api, vm, timeout)


def update_metadata(api: Api, vm: VmInfo, changes: dict[str, str]) -> None:
    """Set `changes` in the VM's metadata (every worker's), every other key kept."""
    backend_of(vm).update_metadata(api, vm, changes)


def lost_reason(before: VmInfo, now: VmInfo) -> str | None:
    """Why the VM `before` (as a run resolved it) is lost, seen as `now`; None while it is not."""
    if now.state in LOST_STATES:
        return f"was {now.state}"
    return backend_of(before).lost_reason(before, now)


def recreate(api: Api, vm: VmInfo, spec: TargetSpec, timeout: float) -> bool:
    """Make the lost VM whole again with the same shape (type, zone, runtime or image, spot, slices); True when
    only its lost workers were made again (the others still run what they ran: a MIG), False when all were."""
    from pathlib import Path

    from tpuops.cloud.create import AUTOSTOP_KEY, CreateRequest
    from tpuops.cloud.keys import default_identity, default_user
    from tpuops.cloud.zone_cache import remember_zone

    ssh_keys = ""  # the next run's first connection adds the key anyway (OS Login or metadata, as needed)
    pub = Path(f"{Path(spec.identity).expanduser() if spec.identity else default_identity()}.pub")
    if pub.is_file():
        ssh_keys = f"{spec.user or default_user()}:{pub.read_text().strip()}"
    req = CreateRequest(
        vm.name,
        vm.accelerator_type,
        vm.runtime_version,
        (vm.zone,),
        spot=vm.spot,
        queued=bool(vm.queued_resource),
        wait=True,
        slices=max(1, len(vm.slices)),  # a multislice is recreated whole: any slice lost is the run lost
        timeout=timeout,
        ssh_keys=ssh_keys,
        internal_ips=not any(w.external_ip for w in vm.workers),
        autostop=vm.metadata.get(AUTOSTOP_KEY, ""),  # the next run's start starts its watcher again
    )
    backend = backend_of(vm)
    backend.recreate(api, vm, req)
    remember_zone(api, vm.name, vm.zone, vm.kind)
    return backend.repairs_itself
