"""A multislice through the Cloud TPU API: one queued resource whose nodes NAME-0..NAME-(N-1) are one VM, its
workers numbered across slices. Deleted, recreated and re-keyed whole."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuops.cloud import tpu_api
from tpuops.cloud.backends.base import Listing
from tpuops.cloud.backends.tpu_node import TpuNode, nodes
from tpuops.cloud.client import ApiNotFoundError

if TYPE_CHECKING:
    from tpuops.cloud.client import Api
    from tpuops.cloud.tpu_api import VmInfo


def _joined(api: Api, listing: Listing) -> list[VmInfo]:
    """The listing's nodes that are slices, joined into one VM per multislice (no call of its own)."""
    groups: dict[tuple[str, str], list[VmInfo]] = {}
    for v in nodes(api, listing):
        if name := tpu_api.multislice_of(v):
            groups.setdefault((v.zone, name), []).append(v)
    out = []
    for (_, name), slices in sorted(groups.items()):
        slices.sort(key=lambda n: int(n.name.rsplit("-", 1)[1]))
        out.append(tpu_api.join_slices(name, slices[0].queued_resource, slices))
    return out


class Multislice(TpuNode):
    kind = "multislice"
    words = "Cloud TPU API multislice"
    label = "tpu (multislice)"

    def get(self, api: Api, zone: str, name: str) -> VmInfo:
        vm = tpu_api.get_multislice(api, zone, name)
        if vm is None:
            raise ApiNotFoundError(f"TPU API get multislice {name} in {zone}: not found")
        return vm

    def find(self, api: Api, name: str, listing: Listing) -> list[VmInfo]:
        # A slice that is still queued is not listed as a node: read the multislice itself where one is.
        zones = sorted({v.zone for v in _joined(api, listing) if v.name == name})
        return [vm for z in zones if (vm := tpu_api.get_multislice(api, z, name))]

    def list_vms(self, api: Api, listing: Listing) -> list[VmInfo]:
        return _joined(api, listing)

    def autostop_calls(self, vm: VmInfo, action: str, tpu: str, compute: str) -> list[tuple[str, str]]:
        """Only deleted, whole: its queued resource (force: with its nodes)."""
        from tpuops.errors import UsageError

        if action == "stop":
            raise UsageError(
                f"{vm.name} is a multislice: tpuops does not stop one (its slices are one queued resource)",
                hint="use --autostop-action delete",
            )
        return [("DELETE", f"{tpu}/v2/{vm.queued_resource}?force=true")]

    def detail_rows(self, vm: VmInfo) -> list[tuple[str, str]]:
        return [
            *super().detail_rows(vm),
            ("slices", f"{len(vm.slices)}: {', '.join(vm.slices)}"),
        ]
