"""A Cloud TPU node through the Cloud TPU API (one slice, one node; a node made from a queued resource too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuops.cloud import tpu_api
from tpuops.cloud.backends.base import GuestAttrs, Listing

if TYPE_CHECKING:
    from tpuops.cloud.client import Api
    from tpuops.cloud.create import CreateRequest
    from tpuops.cloud.tpu_api import VmInfo


def nodes(api: Api, listing: Listing) -> list[VmInfo]:
    """Every node of the listing's zones (every TPU zone at once when none), asked once per listing."""

    def fetch() -> list[VmInfo]:
        found, zones = tpu_api.list_vms(api, listing.zones or None)
        listing.once("tpu-zones", lambda: zones)
        return found

    return listing.once("tpu-nodes", fetch)


class TpuNode:
    kind = "node"
    api = "tpu"
    words = "Cloud TPU API node"
    label = "tpu"
    admin_role = "roles/tpu.admin"
    repairs_itself = False

    def get(self, api: Api, zone: str, name: str) -> VmInfo:
        return tpu_api.get_vm_node(api, zone, name)

    def find(self, api: Api, name: str, listing: Listing) -> list[VmInfo]:
        return [v for v in nodes(api, listing) if v.name == name and not tpu_api.multislice_of(v)]

    def list_vms(self, api: Api, listing: Listing) -> list[VmInfo]:
        return [v for v in nodes(api, listing) if not tpu_api.multislice_of(v)]

    def create(self, api: Api, req: CreateRequest, image: str) -> VmInfo:
        from tpuops.cloud.create import create_vm

        return create_vm(api, req)

    def delete(self, api: Api, vm: VmInfo, timeout: float) -> None:
        tpu_api.delete_vm(api, vm.zone, vm.name, timeout)

    def guest_attributes(self, api: Api, vm: VmInfo) -> GuestAttrs:
        return tpu_api.host_keys(api, vm.zone, vm.name, vm.slices)

    def update_metadata(self, api: Api, vm: VmInfo, changes: dict[str, str]) -> None:
        tpu_api.update_metadata(api, vm, {**vm.metadata, **changes})

    def instance_names(self, vm: VmInfo, attrs: GuestAttrs) -> list[str]:
        """The guest attribute `hostname` of each worker, as gcloud reads it for IAP."""
        from tpuops.errors import ConnectError

        names = []
        for w in vm.workers:
            per = attrs[w.index] if w.index < len(attrs) else {}
            name = next((keys["hostname"] for keys in per.values() if "hostname" in keys), None)
            if not name:
                raise ConnectError(
                    f"{vm.name} w{w.index} publishes no `hostname` guest attribute, so IAP cannot name its "
                    "instance",
                    hint="the VM must be READY and HEALTHY, created after 2022-03-24, and the org policy "
                    "compute.disableGuestAttributesAccess must not be enforced",
                )
            names.append(name)
        return names

    def lost_reason(self, before: VmInfo, now: VmInfo) -> str | None:
        return None

    def recreate(self, api: Api, vm: VmInfo, req: CreateRequest) -> None:
        try:
            self.delete(api, vm, req.timeout)
        except Exception:  # already gone, or going: the create says what is wrong
            pass
        self.create(api, req, "")

    def detail_rows(self, vm: VmInfo) -> list[tuple[str, str]]:
        return [
            ("runtime version", vm.runtime_version or "-"),
            ("queued resource", vm.queued_resource or "-"),
        ]

    def autostop_calls(self, vm: VmInfo, action: str, tpu: str, compute: str) -> list[tuple[str, str]]:
        """nodes.stop, or nodes.delete (a node from a queued resource: the queued resource, which deletes it)."""
        parent = f"{tpu}/v2/projects/{vm.project}/locations/{vm.zone}"
        if action == "stop":
            return [("POST", f"{parent}/nodes/{vm.name}:stop")]
        if vm.queued_resource:
            return [("DELETE", f"{tpu}/v2/{vm.queued_resource}?force=true")]
        return [("DELETE", f"{parent}/nodes/{vm.name}")]
