"""One Compute Engine instance with a TPU machine type: a single-host slice (TPU7x, or any family asked
through Compute Engine)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuops.cloud import compute_api
from tpuops.cloud.backends.base import GuestAttrs, Listing

if TYPE_CHECKING:
    from tpuops.cloud.client import Api
    from tpuops.cloud.create import CreateRequest
    from tpuops.cloud.tpu_api import VmInfo


def compute_listing(api: Api, listing: Listing) -> compute_api.Listed:
    """Every zone's instances and MIGs (two aggregated lists), asked once per listing."""
    return listing.once("compute", lambda: compute_api.listing(api))


class ComputeInstance:
    kind = "instance"
    api = "compute"
    words = "Compute Engine instance"
    label = "compute (instance)"
    admin_role = "roles/compute.instanceAdmin.v1"
    repairs_itself = False

    def get(self, api: Api, zone: str, name: str) -> VmInfo:
        return compute_api.get_instance(api, zone, name)

    def find(self, api: Api, name: str, listing: Listing) -> list[VmInfo]:
        return compute_api.search_instances(api, name)

    def list_vms(self, api: Api, listing: Listing) -> list[VmInfo]:
        instances, _ = compute_listing(api, listing)
        return [
            compute_api.vm_from_instances(api.project, inst["name"], zone, [inst], kind=self.kind)
            for zone, page in instances
            if listing.keep(zone)
            for inst in page
            if compute_api.tpu_instance(inst) and not compute_api.mig_owner(zone, inst)
        ]

    def create(self, api: Api, req: CreateRequest, image: str) -> VmInfo:
        from tpuops.cloud import compute_create

        return compute_create.create_vm(api, req, image)

    def delete(self, api: Api, vm: VmInfo, timeout: float) -> None:
        compute_api.delete_instance(api, vm, timeout)

    def guest_attributes(self, api: Api, vm: VmInfo) -> GuestAttrs:
        return compute_api.guest_attributes(api, vm)

    def update_metadata(self, api: Api, vm: VmInfo, changes: dict[str, str]) -> None:
        """Each instance's own metadata (every worker of a MIG), each with its fingerprint, at once."""
        from concurrent.futures import ThreadPoolExecutor

        def one(i: int) -> None:
            compute_api.set_metadata(api, vm, i, {**vm.instance_metadata[i], **changes})

        with ThreadPoolExecutor(max_workers=max(1, min(16, len(vm.instances)))) as pool:
            list(pool.map(one, range(len(vm.instances))))

    def instance_names(self, vm: VmInfo, attrs: GuestAttrs) -> list[str]:
        return list(vm.instances)

    def lost_reason(self, before: VmInfo, now: VmInfo) -> str | None:
        """An instance recreated under the same name (a new id: new address, new host key)."""
        if now.instance_ids and now.instance_ids != before.instance_ids:
            changed = [
                w
                for w, (a, b) in enumerate(zip(before.instance_ids, now.instance_ids, strict=False))
                if a != b
            ]
            return f"had instances recreated (w{', w'.join(map(str, changed))}: new addresses and host keys)"
        return None

    def recreate(self, api: Api, vm: VmInfo, req: CreateRequest) -> None:
        try:
            self.delete(api, vm, req.timeout)
        except Exception:  # already gone, or going: the create says what is wrong
            pass
        self.create(api, req, vm.runtime_version)

    def autostop_calls(self, vm: VmInfo, action: str, tpu: str, compute: str) -> list[tuple[str, str]]:
        """instances.stop or instances.delete."""
        url = f"{compute}/projects/{vm.project}/zones/{vm.zone}/instances/{vm.name}"
        return [("POST", f"{url}/stop")] if action == "stop" else [("DELETE", url)]

    def detail_rows(self, vm: VmInfo) -> list[tuple[str, str]]:
        return [
            ("machine type", vm.machine_type),
            ("topology", vm.topology),
            ("image", vm.runtime_version or "-"),
        ]
