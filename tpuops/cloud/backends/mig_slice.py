"""A MIG slice on Compute Engine: a managed instance group whose instances are the workers of one multi-host
slice (made from an instance template and a workload policy). The MIG recreates lost instances itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuops.cloud import compute_api
from tpuops.cloud.backends.base import Listing
from tpuops.cloud.backends.compute_instance import ComputeInstance, compute_listing
from tpuops.cloud.waits import wait_for

if TYPE_CHECKING:
    from tpuops.cloud.client import Api
    from tpuops.cloud.compute_json import Instance
    from tpuops.cloud.create import CreateRequest
    from tpuops.cloud.tpu_api import VmInfo


class MigSlice(ComputeInstance):
    kind = "mig"
    words = "Compute Engine MIG"
    label = "compute (mig)"
    repairs_itself = True

    def get(self, api: Api, zone: str, name: str) -> VmInfo:
        return compute_api.get_mig(api, zone, name)

    def find(self, api: Api, name: str, listing: Listing) -> list[VmInfo]:
        return compute_api.search_migs(api, name)

    def list_vms(self, api: Api, listing: Listing) -> list[VmInfo]:
        """Each MIG with its instances (grouped by their `created-by` metadata): no call of its own."""
        instances, migs = compute_listing(api, listing)
        members: dict[str, list[Instance]] = {}
        for zone, page in instances:
            for inst in page:
                if compute_api.tpu_instance(inst) and (owner := compute_api.mig_owner(zone, inst)):
                    members.setdefault(owner, []).append(inst)
        out = []
        for zone, zone_migs in migs:
            for mig in zone_migs:
                group = compute_api.worker_order(members.get(f"{zone}/{mig['name']}", []))
                if not listing.keep(zone) or not group:
                    continue
                target = int(mig.get("targetSize", 0))
                state = "" if len(group) == target else "CREATING"
                out.append(compute_api.vm_from_instances(api.project, mig["name"], zone, group, kind=self.kind,
                                                         vms=target, state=state))  # fmt: skip
        return out

    def delete(self, api: Api, vm: VmInfo, timeout: float) -> None:
        compute_api.delete_mig(api, vm, timeout)

    def lost_reason(self, before: VmInfo, now: VmInfo) -> str | None:
        if now.state == "REPAIRING":
            return "was REPAIRING (its MIG is recreating preempted instances)"
        return super().lost_reason(before, now)

    def autostop_calls(self, vm: VmInfo, action: str, tpu: str, compute: str) -> list[tuple[str, str]]:
        """stop: the group resized to 0 (its template and workload policy stay: resize it back to start again);
        delete: the group (`tpuops vm delete` removes the template and policy it leaves)."""
        url = f"{compute}/projects/{vm.project}/zones/{vm.zone}/instanceGroupManagers/{vm.name}"
        return [("POST", f"{url}/resize?size=0")] if action == "stop" else [("DELETE", url)]

    def recreate(self, api: Api, vm: VmInfo, req: CreateRequest) -> None:
        """The MIG recreates its own instances: wait for READY."""
        wait_for(api, vm.zone, vm.name, lambda: self.get(api, vm.zone, vm.name), "READY", req.timeout)
