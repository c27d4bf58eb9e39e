"""TPU VMs on Compute Engine: an instance with a TPU machine type, or a MIG whose instances are the workers of
one slice. Read as the REST API's JSON (compute_client.read: no google.cloud.compute_v1 import), changed through
google-cloud-compute (compute_client.call and its operations): get, search, list, guest attributes, metadata,
delete."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import cast

from tpuops.cloud.accelerators import accelerator_of, slice_of
from tpuops.cloud.client import Api, ApiNotFoundError
from tpuops.cloud.compute_client import aggregated_pages, call, clients, pages, read, wait_op
from tpuops.cloud.compute_json import GuestAttributes, Instance, ManagedInstances, Metadata, Mig
from tpuops.cloud.tpu_api import VmInfo, WorkerAddr

Listed = tuple[list[tuple[str, list[Instance]]], list[tuple[str, list[Mig]]]]  # (instances, MIGs) per zone
WORKER_NUMBER = (
    "agent-worker-number"  # the worker index in an instance's metadata (as Cloud TPU VMs carry it)
)
IMAGE_KEY = "tpuops-image"  # instance metadata tpuops writes at create: the boot image (to recreate the VM)
CREATED_BY = "created-by"  # metadata Compute Engine gives a MIG's instances: the MIG's path
# Compute's instance status -> the TPU API's node states, so `vm wait --state READY`, the READY check and the
# recovery watch read both kinds alike. A Spot VM that stopped (TERMINATED/STOPPED) was preempted.
_STATES = {
    "PROVISIONING": "CREATING", "STAGING": "CREATING", "PENDING": "CREATING", "RUNNING": "READY",
    "STOPPING": "STOPPING", "PENDING_STOP": "STOPPING", "SUSPENDING": "STOPPING", "SUSPENDED": "STOPPED",
    "REPAIRING": "REPAIRING", "DEPROVISIONING": "DELETING",
}  # fmt: skip


def _md(inst: Instance) -> dict[str, str]:
    return {it["key"]: it.get("value", "") for it in inst.get("metadata", Metadata()).get("items", [])}


def _short(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _state(status: str, spot: bool) -> str:
    if status in ("TERMINATED", "STOPPED"):
        return "PREEMPTED" if spot else "STOPPED"
    return _STATES.get(status, status or "CREATING")


def _spot(inst: Instance) -> bool:
    return inst.get("scheduling", {}).get("provisioningModel") == "SPOT"


def _addr(index: int, inst: Instance) -> WorkerAddr:
    nics = inst.get("networkInterfaces") or [{}]
    external = next((ac["natIP"] for ac in nics[0].get("accessConfigs", []) if ac.get("natIP")), None)
    return WorkerAddr(index, nics[0].get("networkIP", ""), external, 22)


def vm_from_instances(
    project: str, name: str, zone: str, insts: list[Instance], *, kind: str, vms: int = 1, state: str = ""
) -> VmInfo:
    """Instances (in worker order) of a slice of `vms` VMs -> one VmInfo; `state` overrides the instances'
    own (a MIG's, which also counts the instances it is still making)."""
    first = insts[0]
    machine = _short(first.get("machineType", ""))
    accelerator, topology = slice_of(machine, vms)
    spot = _spot(first)
    md0 = _md(first)
    state = state or _state(first.get("status", ""), spot)
    return VmInfo(
        name=name,
        zone=zone,
        project=project,
        state=state,
        health="HEALTHY" if state == "READY" else "",
        accelerator_type=accelerator,
        runtime_version=md0.get(IMAGE_KEY, ""),
        spot=spot,
        preemptible=bool(first.get("scheduling", {}).get("preemptible")),
        workers=tuple(_addr(i, inst) for i, inst in enumerate(insts)),
        create_time=first.get("creationTimestamp", ""),
        metadata=md0,
        api="compute",
        kind=kind,
        machine_type=machine,
        topology=topology,
        status=",".join(sorted({i.get("status", "") for i in insts})),
        instances=tuple(i["name"] for i in insts),
        instance_ids=tuple(str(i.get("id", "")) for i in insts),
        instance_metadata=tuple(_md(i) for i in insts),
        fingerprints=tuple(i.get("metadata", {}).get("fingerprint", "") for i in insts),
    )


def get_instance(api: Api, zone: str, name: str) -> VmInfo:
    inst = cast(Instance, read(api, f"get instance {name} in {zone}", f"zones/{zone}/instances/{name}"))
    return vm_from_instances(api.project, name, zone, [inst], kind="instance")


def get_mig(api: Api, zone: str, name: str) -> VmInfo:
    mig = cast(Mig, read(api, f"get MIG {name} in {zone}", f"zones/{zone}/instanceGroupManagers/{name}"))
    return mig_vm(api, zone, mig)


def worker_order(insts: list[Instance]) -> list[Instance]:
    """The slice's workers: by the worker number in each instance's metadata, else by name."""

    def key(inst: Instance) -> tuple[int, str]:
        number = _md(inst).get(WORKER_NUMBER, "")
        return (int(number) if number.isdigit() else 1 << 30, inst["name"])

    return sorted(insts, key=key)


def mig_vm(api: Api, zone: str, mig: Mig) -> VmInfo:
    """A MIG (as the API gave it) -> its slice: listManagedInstances for the members and one instances.list
    (filtered on the base name) for their addresses and metadata."""
    name = mig["name"]
    answer = read(api, f"list instances of MIG {name}",
                  f"zones/{zone}/instanceGroupManagers/{name}/listManagedInstances", method="POST")  # fmt: skip
    members = cast(ManagedInstances, answer).get("managedInstances", [])
    names = {m.get("name") or _short(m.get("instance", "")) for m in members}
    base = mig.get("baseInstanceName") or name
    found = pages(
        api, f"list instances of MIG {name}", f"zones/{zone}/instances", {"filter": f'name eq "{base}-.*"'}
    )
    insts = worker_order([i for i in found if i["name"] in names])
    target = int(mig.get("targetSize", 0))
    actions = {m.get("currentAction", "") for m in members}
    statuses = [m.get("instanceStatus", "") for m in members]
    spot = bool(insts) and _spot(insts[0])
    if any(s in ("TERMINATED", "STOPPED") for s in statuses):
        state = "PREEMPTED" if spot else "STOPPED"
    elif "RECREATING" in actions:
        state = "REPAIRING"
    elif "DELETING" in actions:
        state = "DELETING"
    elif len(insts) == target and all(s == "RUNNING" for s in statuses) and actions <= {"NONE", ""}:
        state = "READY"
    else:
        state = "CREATING"
    if not insts:
        return VmInfo(name, zone, api.project, state, "", "", "", False, False, (), api="compute", kind="mig")
    return vm_from_instances(api.project, name, zone, insts, kind="mig", vms=target, state=state)


def tpu_instance(inst: Instance) -> bool:
    return bool(accelerator_of(_short(inst.get("machineType", ""))))


def aggregated_instances(api: Api, flt: str = "") -> list[tuple[str, list[Instance]]]:
    """(zone, instances) of one aggregatedList over every zone."""
    scopes = aggregated_pages(api, "list instances", "aggregated/instances", {"filter": flt} if flt else {})
    return [(scope.rsplit("/", 1)[-1], page.get("instances", [])) for scope, page in scopes]


def aggregated_migs(api: Api, flt: str = "") -> list[tuple[str, list[Mig]]]:
    """(zone, MIGs) of one aggregatedList over every zone."""
    scopes = aggregated_pages(
        api, "list MIGs", "aggregated/instanceGroupManagers", {"filter": flt} if flt else {}
    )
    return [(scope.rsplit("/", 1)[-1], page.get("instanceGroupManagers", [])) for scope, page in scopes]


def search_instances(api: Api, name: str) -> list[VmInfo]:
    """TPU instances named `name` in any zone: one aggregatedList filtered on the name."""
    found = aggregated_instances(api, f'name eq "{name}"')
    return [vm_from_instances(api.project, i["name"], zone, [i], kind="instance")
            for zone, page in found for i in page
            if i["name"] == name and tpu_instance(i) and not mig_owner(zone, i)]  # fmt: skip


def search_migs(api: Api, name: str) -> list[VmInfo]:
    """MIG slices named `name` in any zone: one aggregatedList filtered on the name, then each one's members."""
    out = []
    for zone, page in aggregated_migs(api, f'name eq "{name}"'):
        for mig in page:
            if mig["name"] == name:
                vm = mig_vm(api, zone, mig)
                if vm.accelerator_type or not vm.workers:
                    out.append(vm)
    return out


def listing(api: Api) -> Listed:
    """(instances, MIGs) of every zone: two aggregatedList calls, at once (what the instance and MIG backends
    each pick their VMs from)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        insts = pool.submit(aggregated_instances, api)
        migs = pool.submit(aggregated_migs, api)
        return insts.result(), migs.result()


def mig_owner(zone: str, inst: Instance) -> str:
    """`ZONE/MIG` of the MIG an instance belongs to (its `created-by` metadata), '' for a lone instance."""
    owner = _md(inst).get(CREATED_BY, "")
    return f"{zone}/{_short(owner)}" if "/instanceGroupManagers/" in owner else ""


def guest_attributes(api: Api, vm: VmInfo) -> list[dict[str, dict[str, str]]]:
    """Per worker, in worker order: {namespace: {key: value}} from the instance's guest attributes, query path
    `hostkeys/` (what the guest agent publishes there: key = key type, value = base64 blob). One call per
    instance (Compute has no per-slice read), all at once."""

    def one(instance: str) -> dict[str, dict[str, str]]:
        answer = read(api, f"guest attributes of {instance}",
                      f"zones/{vm.zone}/instances/{instance}/getGuestAttributes", {"queryPath": "hostkeys/"})  # fmt: skip
        resp = cast(GuestAttributes, answer)
        per: dict[str, dict[str, str]] = {}
        for item in resp.get("queryValue", {}).get("items", []):
            per.setdefault(item.get("namespace", ""), {})[item.get("key", "")] = item.get("value", "")
        return per

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(vm.instances)))) as pool:
        return list(pool.map(one, vm.instances))


def set_metadata(api: Api, vm: VmInfo, index: int, metadata: dict[str, str], timeout: float = 300.0) -> None:
    """Replace one instance's metadata items (with its fingerprint, as setMetadata requires) and wait."""
    c = clients(api)
    instance = vm.instances[index]
    body = {
        "fingerprint": vm.fingerprints[index],
        "items": [{"key": k, "value": v} for k, v in metadata.items()],
    }
    op = call(
        api, f"update metadata of {instance}", c.instances.set_metadata, project=api.project, zone=vm.zone,
        instance=instance, metadata_resource=body,
    )  # fmt: skip
    wait_op(api, op, f"update metadata of {instance}", timeout)


def template_name(name: str) -> str:
    """The instance template tpuops makes for the MIG slice `name`."""
    return f"{name}-tpl"


def policy_name(name: str) -> str:
    """The workload policy (the slice's accelerator topology) tpuops makes for the MIG slice `name`."""
    return f"{name}-wp"


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def delete_instance(api: Api, vm: VmInfo, timeout: float) -> None:
    """instances.delete, awaited."""
    c = clients(api)
    op = call(
        api, f"delete {vm.name}", c.instances.delete, project=api.project, zone=vm.zone, instance=vm.name
    )
    wait_op(api, op, f"delete {vm.name}", timeout)


def delete_mig(api: Api, vm: VmInfo, timeout: float) -> None:
    """The group (which deletes its instances), then the template and workload policy tpuops made for it
    (named after it), each awaited."""
    c = clients(api)
    op = call(
        api, f"delete MIG {vm.name}", c.migs.delete, project=api.project, zone=vm.zone,
        instance_group_manager=vm.name,
    )  # fmt: skip
    wait_op(api, op, f"delete MIG {vm.name}", timeout)
    for what, fn, kw in (
        ("template", c.templates.delete, {"instance_template": template_name(vm.name)}),
        ("workload policy", c.policies.delete,
         {"region": region_of(vm.zone), "resource_policy": policy_name(vm.name)}),
    ):  # fmt: skip
        try:
            op = call(api, f"delete {what} of {vm.name}", fn, project=api.project, **kw)
        except ApiNotFoundError:
            continue  # not made by tpuops (or already gone)
        wait_op(api, op, f"delete {what} of {vm.name}", timeout)
