"""The one protocol every cloud backend implements (a Cloud TPU node, a multislice, a Compute Engine instance, a
MIG slice), and `Listing`: what one `vm list` asked each API, asked once and shared by the backends it serves."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

if TYPE_CHECKING:
    from tpuops.cloud.client import Api
    from tpuops.cloud.create import CreateRequest
    from tpuops.cloud.tpu_api import VmInfo

T = TypeVar("T")
GuestAttrs = list[dict[str, dict[str, str]]]  # per worker, in worker order: {namespace: {key: value}}


class Backend(Protocol):
    """One kind of TPU VM, through the API that serves it. Callers never ask which API a VM came from: they
    ask `backends.backend_of(vm)` and call it."""

    kind: str  # VmInfo.kind of the VMs it serves (the registry's key)
    api: str  # VmInfo.api: which Google API ("tpu", "compute")
    words: str  # in a sentence: "Cloud TPU API node"
    label: str  # `vm list`'s api column
    admin_role: str  # the IAM role that changes its VMs (metadata, delete, create)
    repairs_itself: bool  # the API recreates lost workers itself (a MIG): the others keep running

    def get(self, api: Api, zone: str, name: str) -> VmInfo:
        """The VM `name` in `zone`; ApiNotFoundError when this backend has none of that name there."""
        ...

    def find(self, api: Api, name: str, listing: Listing) -> list[VmInfo]:
        """Every VM of this kind named `name`, in any zone (from `listing` where it holds the answer)."""
        ...

    def list_vms(self, api: Api, listing: Listing) -> list[VmInfo]:
        """Every VM of this kind in `listing.zones` (every zone when empty)."""
        ...

    def create(self, api: Api, req: CreateRequest, image: str) -> VmInfo:
        """Make it (trying `req.zones` in turn where the API allows), awaited to READY with `req.wait`."""
        ...

    def delete(self, api: Api, vm: VmInfo, timeout: float) -> None: ...

    def guest_attributes(self, api: Api, vm: VmInfo) -> GuestAttrs:
        """Per worker: its guest attributes (host keys in namespace `hostkeys`)."""
        ...

    def update_metadata(self, api: Api, vm: VmInfo, changes: dict[str, str]) -> None:
        """Set `changes` in the VM's metadata (every worker's), every other key kept."""
        ...

    def instance_names(self, vm: VmInfo, attrs: GuestAttrs) -> list[str]:
        """Each worker's Compute Engine instance name (what IAP tunnels to)."""
        ...

    def lost_reason(self, before: VmInfo, now: VmInfo) -> str | None:
        """Why `before` (as a run resolved it) is lost, seen as `now`, beyond a lost state; None if it is not."""
        ...

    def recreate(self, api: Api, vm: VmInfo, req: CreateRequest) -> None:
        """Make a lost VM whole again with the same shape (`req`: how it was made)."""
        ...

    def detail_rows(self, vm: VmInfo) -> list[tuple[str, str]]:
        """`vm describe`'s rows that only this kind has (machine type, runtime version or image, ...)."""
        ...

    def autostop_calls(self, vm: VmInfo, action: str, tpu: str, compute: str) -> list[tuple[str, str]]:
        """(method, URL) of the REST calls that `stop` or `delete` the VM (its autostop watcher makes them with
        the VM's own credentials); `tpu`: the Cloud TPU API's base URL, `compute`: Compute Engine's (…/compute/v1).
        UsageError when this kind cannot do `action` to itself."""
        ...


class Listing:
    """One listing's answers from each API, each asked at most once whichever backends read it (thread-safe:
    the backends list at once). `zones`: the zones asked for ([] = every zone)."""

    def __init__(self, zones: list[str]) -> None:
        self.zones = list(zones)
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._answers: dict[str, object] = {}  # key -> fetch()'s answer, of the type its `once` asks for
        self._errors: dict[str, Exception] = {}

    def once(self, key: str, fetch: Callable[[], T]) -> T:
        """`fetch()` the first time `key` is asked, its answer (or its error) every time after."""
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._answers and key not in self._errors:
                try:
                    self._answers[key] = fetch()
                except Exception as e:  # the same error for every backend that reads this answer
                    self._errors[key] = e
            error, value = self._errors.get(key), self._answers.get(key)
        if error is not None:
            raise error
        return cast(T, value)

    def keep(self, zone: str) -> bool:
        return not self.zones or zone in self.zones

    @property
    def searched(self) -> list[str]:
        """The zones the Cloud TPU API was asked (set by the node listing)."""
        return list(cast(list[str], self._answers.get("tpu-zones", self.zones)))
