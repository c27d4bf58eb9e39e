"""TPU VMs on Compute Engine (google-cloud-compute, REST): an instance with a TPU machine type, or a MIG whose
instances are the workers of one slice. Get, search, list, guest attributes, metadata, delete and waits, with
the library's retry (`google.api_core.retry.Retry`) and operation helper (`ExtendedOperation.result`)."""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from tpuops.cloud.accelerators import accelerator_of, slice_of
from tpuops.cloud.client import Api, ApiNotFoundError, short_error
from tpuops.cloud.tpu_api import VmInfo, WorkerAddr
from tpuops.errors import CloudError, CommandTimeoutError, PermissionDeniedError

T = TypeVar("T")
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


@dataclass(frozen=True)
class Clients:
    """The Compute Engine clients tpuops uses, built once per process and endpoint (one id for the log)."""

    instances: Any
    migs: Any
    templates: Any
    policies: Any
    client_id: str


_built = itertools.count(1)


@functools.cache
def _clients(endpoint: str | None) -> Clients:
    """REST clients (the only transport of google-cloud-compute): anonymous credentials against `endpoint`
    (the emulator), else Application Default Credentials against compute.googleapis.com. Imported here only:
    `google.cloud.compute_v1` costs ~1.4 s and no command that does not reach Compute Engine pays it."""
    from google.api_core.client_options import ClientOptions
    from google.cloud import compute_v1

    kw: dict[str, Any] = {"transport": "rest"}
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        kw.update(credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=endpoint))
    try:
        made: list[Any] = [
            compute_v1.InstancesClient(**kw),
            compute_v1.InstanceGroupManagersClient(**kw),
            compute_v1.InstanceTemplatesClient(**kw),
            compute_v1.ResourcePoliciesClient(**kw),
        ]
    except Exception as e:  # google.auth.exceptions.DefaultCredentialsError
        raise CloudError(
            f"no Google credentials: {str(e).splitlines()[0]}",
            hint="run `gcloud auth application-default login`, or use the emulator with --api-endpoint",
        ) from None
    if endpoint:
        # The library builds the operations client that `operation.result()` polls with the credentials only,
        # never the client options (compute_v1/services/*/transports/base.py `_zone_operations_client`): it
        # would poll compute.googleapis.com. Hand each transport operations clients for the same endpoint.
        ops = {
            "zone_operations": compute_v1.ZoneOperationsClient(**kw),
            "region_operations": compute_v1.RegionOperationsClient(**kw),
            "global_operations": compute_v1.GlobalOperationsClient(**kw),
        }
        for client in made:
            getattr(client._transport, "_extended_operations_services", {}).update(ops)
    instances, migs, templates, policies = made
    return Clients(instances, migs, templates, policies, client_id=f"{os.getpid()}-c{next(_built)}")


def clients(api: Api) -> Clients:
    return _clients(api.endpoint)


def _headers(api: Api) -> list[tuple[str, str]]:
    """The emulator's request-log marks (custom endpoints only), with the Compute clients' own id."""
    if not api.endpoint:
        return []
    marks = [("x-tpuops-client", clients(api).client_id)]
    return [*marks, ("x-tpuops-purpose", api.purpose)] if api.purpose else marks


def call(api: Api, what: str, fn: Callable[..., T], /, **kw: Any) -> T:
    """`fn(**kw)` with the same google.api_core Retry as the TPU API's (`Api.retry`: backoff with jitter on
    429/503/504 and refused connections, at most `api.retries` retries, each said through `notify`); other
    errors -> TpuopsError (a 403 names the Compute Engine role)."""
    try:
        return fn(**kw, retry=api.retry(what, "Compute API"), timeout=api.timeout_s, metadata=_headers(api))
    except CloudError:
        raise
    except Exception as e:
        raise compute_error(what, e) from None


# Calls that only read need a viewer role; the others change instances, templates, policies or groups.
_READS = ("get", "list", "search", "guest attributes", "poll")


def compute_error(what: str, e: Exception) -> Exception:
    """A Compute API exception -> a TpuopsError; a 403 names the role (as the TPU path does)."""
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
        return CloudError(f"Compute API {what}: {short_error(e)}")
    return e


def wait_op(api: Api, op: Any, what: str, timeout: float) -> None:
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
        raise compute_error(what, e) from None
    detail = _op_errors(op)
    if detail:
        raise CloudError(f"{what}: {detail}")


def _op_errors(op: Any) -> str:
    """`CODE message; ...` of a finished operation's `error.errors[]`, '' when it has none."""
    errors = getattr(getattr(op, "error", None), "errors", None) or []
    return "; ".join(f"{e.code} {e.message}".strip() for e in errors)


def capacity_error(e: CloudError) -> bool:
    """A stockout (the zone has no such TPUs now): try the next zone."""
    text = e.message
    return "RESOURCE_POOL_EXHAUSTED" in text or "does not have enough resources" in text


# -- reading instances and groups -------------------------------------------------------------------------


def _md(msg: Any) -> dict[str, str]:
    return {it.key: it.value for it in msg.metadata.items}


def _short(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _state(status: str, spot: bool) -> str:
    if status in ("TERMINATED", "STOPPED"):
        return "PREEMPTED" if spot else "STOPPED"
    return _STATES.get(status, status or "CREATING")


def _addr(index: int, inst: Any) -> WorkerAddr:
    nic = inst.network_interfaces[0] if inst.network_interfaces else None
    external = next((ac.nat_i_p for ac in nic.access_configs if ac.nat_i_p), None) if nic else None
    return WorkerAddr(index, nic.network_i_p if nic else "", external, 22)


def vm_from_instances(
    project: str, name: str, zone: str, insts: list[Any], *, kind: str, vms: int = 1, state: str = ""
) -> VmInfo:
    """Instances (in worker order) of a slice of `vms` VMs -> one VmInfo; `state` overrides the instances'
    own (a MIG's, which also counts the instances it is still making)."""
    first = insts[0]
    machine = _short(first.machine_type)
    accelerator, topology = slice_of(machine, vms)
    spot = first.scheduling.provisioning_model == "SPOT"
    md0 = _md(first)
    return VmInfo(
        name=name,
        zone=zone,
        project=project,
        state=state or _state(first.status, spot),
        health="HEALTHY" if (state or _state(first.status, spot)) == "READY" else "",
        accelerator_type=accelerator,
        runtime_version=md0.get(IMAGE_KEY, ""),
        spot=spot,
        preemptible=bool(first.scheduling.preemptible),
        workers=tuple(_addr(i, inst) for i, inst in enumerate(insts)),
        create_time=first.creation_timestamp,
        metadata=md0,
        api="compute",
        kind=kind,
        machine_type=machine,
        topology=topology,
        status=",".join(sorted({i.status for i in insts})),
        instances=tuple(i.name for i in insts),
        instance_ids=tuple(str(i.id) for i in insts),
        instance_metadata=tuple(_md(i) for i in insts),
        fingerprints=tuple(i.metadata.fingerprint for i in insts),
    )


def get_instance(api: Api, zone: str, name: str) -> VmInfo:
    inst = call(
        api, f"get instance {name} in {zone}", clients(api).instances.get, project=api.project, zone=zone,
        instance=name,
    )  # fmt: skip
    return vm_from_instances(api.project, name, zone, [inst], kind="instance")


def get_mig(api: Api, zone: str, name: str) -> VmInfo:
    mig = call(
        api, f"get MIG {name} in {zone}", clients(api).migs.get, project=api.project, zone=zone,
        instance_group_manager=name,
    )  # fmt: skip
    return mig_vm(api, zone, mig)


def _worker_order(insts: list[Any]) -> list[Any]:
    """The slice's workers: by the worker number in each instance's metadata, else by name."""

    def key(inst: Any) -> tuple[int, str]:
        number = _md(inst).get(WORKER_NUMBER, "")
        return (int(number) if number.isdigit() else 1 << 30, inst.name)

    return sorted(insts, key=key)


def mig_vm(api: Api, zone: str, mig: Any) -> VmInfo:
    """A MIG (as the API gave it) -> its slice: listManagedInstances for the members and one instances.list
    (filtered on the base name) for their addresses and metadata."""
    c = clients(api)

    def managed(**kw: Any) -> list[Any]:
        return list(c.migs.list_managed_instances(**kw))

    members = call(
        api, f"list instances of MIG {mig.name}", managed, project=api.project, zone=zone,
        instance_group_manager=mig.name,
    )  # fmt: skip
    names = {m.name for m in members}
    base = mig.base_instance_name or mig.name

    def listed(**kw: Any) -> list[Any]:
        return list(c.instances.list(**kw))

    found = call(
        api, f"list instances of MIG {mig.name}", listed,
        request={"project": api.project, "zone": zone, "filter": f'name eq "{base}-.*"'},
    )  # fmt: skip
    insts = _worker_order([i for i in found if i.name in names])
    target = int(mig.target_size)
    actions = {m.current_action for m in members}
    statuses = [m.instance_status for m in members]
    spot = bool(insts) and insts[0].scheduling.provisioning_model == "SPOT"
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
        return VmInfo(mig.name, zone, api.project, state, "", "", "", False, False, (), api="compute",
                      kind="mig")  # fmt: skip
    return vm_from_instances(api.project, mig.name, zone, insts, kind="mig", vms=target, state=state)


def get_vm(api: Api, zone: str, name: str, kind: str) -> VmInfo:
    return get_mig(api, zone, name) if kind == "mig" else get_instance(api, zone, name)


def find_in_zone(api: Api, zone: str, name: str) -> VmInfo | None:
    """An instance named `name` in `zone`, else a MIG of that name; None when neither exists."""
    try:
        return get_instance(api, zone, name)
    except ApiNotFoundError:
        pass
    try:
        return get_mig(api, zone, name)
    except ApiNotFoundError:
        return None


def _tpu_instance(inst: Any) -> bool:
    return bool(accelerator_of(_short(inst.machine_type)))


def search(api: Api, name: str) -> list[VmInfo]:
    """Every zone at once: one aggregatedList of instances and one of MIGs, both filtered on the name."""
    c = clients(api)
    flt = f'name eq "{name}"'

    def agg(client: Any, **kw: Any) -> list[tuple[str, Any]]:
        return list(client.aggregated_list(**kw))

    with ThreadPoolExecutor(max_workers=2) as pool:
        req = {"project": api.project, "filter": flt}
        insts = pool.submit(call, api, "search instances", functools.partial(agg, c.instances), request=req)
        migs = pool.submit(call, api, "search MIGs", functools.partial(agg, c.migs), request=req)
        inst_pages, mig_pages = insts.result(), migs.result()
    out: list[VmInfo] = []
    for scope, page in inst_pages:
        zone = scope.rsplit("/", 1)[-1]
        out += [vm_from_instances(api.project, i.name, zone, [i], kind="instance")
                for i in page.instances if i.name == name and _tpu_instance(i)]  # fmt: skip
    for scope, page in mig_pages:
        zone = scope.rsplit("/", 1)[-1]
        for mig in page.instance_group_managers:
            if mig.name == name:
                vm = mig_vm(api, zone, mig)
                if vm.accelerator_type or not vm.workers:
                    out.append(vm)
    return out


def list_vms(api: Api, zones: list[str] | None) -> list[VmInfo]:
    """TPU VMs on Compute Engine: single instances with a TPU machine type, and MIGs (each one slice, its
    instances grouped by their `created-by` metadata). Two aggregatedList calls, whatever the zones."""
    c = clients(api)

    def agg(client: Any, **kw: Any) -> list[tuple[str, Any]]:
        return list(client.aggregated_list(**kw))

    with ThreadPoolExecutor(max_workers=2) as pool:
        insts = pool.submit(
            call, api, "list instances", functools.partial(agg, c.instances), project=api.project
        )
        migs = pool.submit(call, api, "list MIGs", functools.partial(agg, c.migs), project=api.project)
        inst_pages, mig_pages = insts.result(), migs.result()
    keep = (lambda z: z in zones) if zones else (lambda _z: True)
    members: dict[str, list[Any]] = {}
    out: list[VmInfo] = []
    for scope, page in inst_pages:
        zone = scope.rsplit("/", 1)[-1]
        for inst in page.instances:
            if not keep(zone) or not _tpu_instance(inst):
                continue
            owner = _md(inst).get(CREATED_BY, "")
            if "/instanceGroupManagers/" in owner:
                members.setdefault(f"{zone}/{_short(owner)}", []).append(inst)
            else:
                out.append(vm_from_instances(api.project, inst.name, zone, [inst], kind="instance"))
    for scope, page in mig_pages:
        zone = scope.rsplit("/", 1)[-1]
        for mig in page.instance_group_managers:
            group = _worker_order(members.get(f"{zone}/{mig.name}", []))
            if not keep(zone) or not group:
                continue
            target = int(mig.target_size)
            state = "" if len(group) == target else "CREATING"
            out.append(
                vm_from_instances(api.project, mig.name, zone, group, kind="mig", vms=target, state=state)
            )
    return out


def guest_attributes(api: Api, vm: VmInfo) -> list[dict[str, dict[str, str]]]:
    """Per worker, in worker order: {namespace: {key: value}} from the instance's guest attributes, query path
    `hostkeys/` (what the guest agent publishes there: key = key type, value = base64 blob). One call per
    instance (Compute has no per-slice read), all at once."""
    c = clients(api)

    def one(instance: str) -> dict[str, dict[str, str]]:
        resp = call(
            api, f"guest attributes of {instance}", c.instances.get_guest_attributes,
            request={"project": api.project, "zone": vm.zone, "instance": instance, "query_path": "hostkeys/"},
        )  # fmt: skip
        per: dict[str, dict[str, str]] = {}
        for item in resp.query_value.items:
            per.setdefault(item.namespace, {})[item.key] = item.value
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


def delete_vm(api: Api, vm: VmInfo, timeout: float) -> None:
    """An instance: instances.delete. A MIG: the group (which deletes its instances), then the template and
    workload policy tpuops made for it (named after it), each awaited."""
    c = clients(api)
    if vm.kind == "instance":
        op = call(
            api, f"delete {vm.name}", c.instances.delete, project=api.project, zone=vm.zone, instance=vm.name
        )
        wait_op(api, op, f"delete {vm.name}", timeout)
        return
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
