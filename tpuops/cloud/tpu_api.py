"""TPU VMs through the TPU API: list (zones in parallel), get, delete, wait for a state, guest attributes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

from tpuops.cloud.client import Api, ApiNotFoundError, api_error
from tpuops.errors import CloudError, CommandTimeoutError

if TYPE_CHECKING:
    from google.api_core.operation import Operation
    from google.api_core.retry import Retry
    from google.cloud.tpu_v2 import Node
    from google.longrunning.operations_pb2 import Operation as RawOperation

ZONE_SEARCH_WIDTH = (
    10  # zones listed at once: requests' connection pool size (no socket opened to be dropped)
)


@dataclass(frozen=True)
class WorkerAddr:
    index: int
    internal_ip: str
    external_ip: str | None
    port: int  # the API's network-endpoint port (the emulator puts each worker's sshd port here)
    slice: int = 0  # which slice of a multislice the worker is on (0 on a one-slice VM)


@dataclass(frozen=True)
class VmInfo:
    """What tpuops needs of a TPU node, copied out of the API's message right after the call."""

    name: str
    zone: str
    project: str
    state: str
    health: str
    accelerator_type: str
    runtime_version: str
    spot: bool
    preemptible: bool
    workers: tuple[WorkerAddr, ...]
    queued_resource: str = ""
    create_time: str = ""
    # A multislice (one queued resource, several nodes): each slice's node id, in slice order; workers are
    # numbered across slices (slice 0's first). Empty for a one-slice VM.
    slices: tuple[str, ...] = ()
    # The node's metadata (ssh-keys, enable-oslogin, ...); not in to_dict: ssh-keys is long and not state.
    metadata: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    api: str = "tpu"  # "tpu": the Cloud TPU API; "compute": Compute Engine (compute_api.py)
    # Which backend serves it (tpuops.cloud.backends: the one place that chooses by it): "node", "multislice"
    # (one queued resource, several nodes), "instance" (one Compute Engine TPU VM) or "mig" (a MIG's slice).
    kind: str = "node"
    machine_type: str = ""  # Compute Engine: each VM's machine type (tpu7x-standard-4t, ...)
    topology: str = ""  # Compute Engine: the slice's accelerator topology (2x2x1, 4x4, ...)
    status: str = ""  # Compute Engine: the instances' own status (RUNNING, TERMINATED, ...); `state` maps it
    instances: tuple[str, ...] = ()  # Compute Engine: each worker's instance name, in worker order
    instance_ids: tuple[str, ...] = ()  # ...and id (a recreated instance keeps its name, not its id)
    # Compute Engine: each instance's own metadata and its fingerprint (setMetadata needs both); not in to_dict.
    instance_metadata: tuple[dict[str, str], ...] = field(default=(), compare=False, repr=False)
    fingerprints: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def to_dict(self) -> dict[str, object]:
        out = {**asdict(self), "worker_count": len(self.workers)}
        for private in ("metadata", "instance_metadata", "fingerprints"):
            out.pop(private)
        return out


def vm_from_node(node: Node) -> VmInfo:
    _, project, _, zone, _, name = node.name.split("/")
    return VmInfo(
        name=name,
        zone=zone,
        project=project,
        state=node.state.name,
        health=node.health.name,
        accelerator_type=node.accelerator_type,
        runtime_version=node.runtime_version,
        spot=bool(node.scheduling_config.spot),
        preemptible=bool(node.scheduling_config.preemptible),
        workers=tuple(
            WorkerAddr(i, ep.ip_address, ep.access_config.external_ip or None, ep.port)
            for i, ep in enumerate(node.network_endpoints)
        ),
        queued_resource=node.queued_resource,
        create_time=node.create_time.isoformat() if node.create_time else "",
        metadata=dict(node.metadata),
    )


def node_name(api: Api, zone: str, name: str) -> str:
    return f"{api.parent(zone)}/nodes/{name}"


def list_zone(api: Api, zone: str) -> list[VmInfo]:
    def pages(parent: str, retry: Retry, timeout: float, metadata: list[tuple[str, str]]) -> list[Node]:
        return list(api.client.list_nodes(parent=parent, retry=retry, timeout=timeout, metadata=metadata))

    return [vm_from_node(n) for n in api.call(f"list nodes in {zone}", pages, parent=api.parent(zone))]


def list_vms(api: Api, zones: list[str] | None = None) -> tuple[list[VmInfo], list[str]]:
    """(VMs, zones searched). Without zones every TPU location is listed at once, one thread per zone;
    a zone that fails is reported and skipped unless every zone fails."""
    zones = zones or api.zones()
    if len(zones) == 1:
        return list_zone(api, zones[0]), zones
    vms: list[VmInfo] = []
    errors: list[str] = []
    # At most as many at once as the REST session keeps connections (requests' pool of 10): none is
    # opened only to be thrown away (urllib3 would warn "connection pool is full").
    with ThreadPoolExecutor(max_workers=min(ZONE_SEARCH_WIDTH, len(zones))) as pool:
        futures = {z: pool.submit(list_zone, api, z) for z in zones}
        for zone, fut in futures.items():
            try:
                vms += fut.result()
            except CloudError as e:
                errors.append(f"{zone}: {e.message}")
    if errors and len(errors) == len(zones):
        raise CloudError(f"listing TPU VMs failed in every zone; first: {errors[0]}")
    for err in errors:
        api.notify(f"skipped zone {err}")
    return sorted(vms, key=lambda v: (v.zone, v.name)), zones


def get_vm(api: Api, zone: str, name: str) -> VmInfo:
    """The node `name`, or when there is none, the multislice queued resource `name` (all its slices as one VM)."""
    try:
        return get_vm_node(api, zone, name)
    except ApiNotFoundError:
        multi = get_multislice(api, zone, name)
        if multi is None:
            raise
        return multi


def slice_state(states: list[str]) -> str:
    """One state for a multislice: PREEMPTED if any slice is (the run is lost with it), READY only when every
    slice is, else the first slice's state that is not READY."""
    if "PREEMPTED" in states:
        return "PREEMPTED"
    return next((s for s in states if s != "READY"), "READY")


def get_multislice(api: Api, zone: str, name: str) -> VmInfo | None:
    """The queued resource `name` created with multislice parameters, as one VmInfo: nodes PREFIX-0..N-1 (the
    API's own naming), their workers numbered in slice order. None when no such multislice exists."""
    qr_name = f"{api.parent(zone)}/queuedResources/{name}"
    try:
        qr = api.call(f"get {qr_name}", api.client.get_queued_resource, name=qr_name)
    except ApiNotFoundError:
        return None
    specs = list(qr.tpu.node_spec)
    if not specs or specs[0].multislice_params.node_count < 2:
        return None
    params = specs[0].multislice_params
    ids = tuple(f"{params.node_id_prefix or name}-{i}" for i in range(params.node_count))
    nodes: list[VmInfo] = []
    for node_id in ids:
        try:
            nodes.append(get_vm_node(api, zone, node_id))
        except ApiNotFoundError:
            nodes.append(replace(_absent(api, zone, node_id), state=f"QUEUED:{qr.state.state.name}"))
    return join_slices(name, qr_name, nodes)


def join_slices(name: str, qr_name: str, nodes: list[VmInfo]) -> VmInfo:
    """A multislice's nodes (in slice order) -> one VmInfo: every slice's workers numbered across slices."""
    per_slice = [(s, w) for s, n in enumerate(nodes) for w in n.workers]
    workers = tuple(replace(w, index=k, slice=s) for k, (s, w) in enumerate(per_slice))
    first = nodes[0]
    return replace(
        first,
        name=name,
        state=slice_state([n.state for n in nodes]),
        health=next((n.health for n in nodes if n.health not in ("", "HEALTHY")), first.health),
        workers=workers,
        queued_resource=qr_name,
        slices=tuple(n.name for n in nodes),
        kind="multislice",
    )


def multislice_of(node: VmInfo) -> str:
    """The multislice a node is a slice of (its queued resource's id, when the node is named ID-K), else ''."""
    qr = node.queued_resource.rsplit("/", 1)[-1]
    prefix, _, k = node.name.rpartition("-")
    return qr if qr and prefix == qr and k.isdigit() else ""


def get_vm_node(api: Api, zone: str, name: str) -> VmInfo:
    return vm_from_node(
        api.call(f"get {name} in {zone}", api.client.get_node, name=node_name(api, zone, name))
    )


def _absent(api: Api, zone: str, name: str) -> VmInfo:
    return VmInfo(name, zone, api.project, "", "", "", "", False, False, ())


def host_keys(
    api: Api, zone: str, name: str, slices: tuple[str, ...] = ()
) -> list[dict[str, dict[str, str]]]:
    """Per worker, in worker order: {namespace: {key: value}} of its guest attributes (as gcloud reads them:
    namespace `hostkeys`, key = key type such as ssh-ed25519, value = the base64 key blob). For a multislice
    (`slices`: its node ids) every slice's workers, in slice order."""
    out: list[dict[str, dict[str, str]]] = []
    for node in slices or (name,):
        resp = api.call(
            f"guest attributes of {node}",
            api.client.get_guest_attributes,
            request={"name": node_name(api, zone, node)},
        )
        for ga in resp.guest_attributes:
            per: dict[str, dict[str, str]] = {}
            for item in ga.query_value.items:
                per.setdefault(item.namespace, {})[item.key] = item.value
            out.append(per)
    return out


def wait_op(api: Api, op: Operation, what: str, timeout: float) -> RawOperation:
    """Wait for a long-running operation with the library's own helper (`Operation.result`: it polls with
    backoff, each poll retried as every call is); returns the raw operations_pb2.Operation, whose `error`
    the caller reads (a stockout is not an exception there: create tries the next zone)."""
    import concurrent.futures

    from google.api_core import exceptions as gexc
    from google.api_core.future import polling

    # The first polls come fast (the emulator and small operations finish in well under a second).
    poll = polling.DEFAULT_POLLING.with_delay(initial=0.05, maximum=5.0, multiplier=1.5).with_timeout(timeout)
    try:
        op.result(retry=api.retry(f"poll {what}"), polling=poll)
    except (concurrent.futures.TimeoutError, gexc.RetryError):
        raise CommandTimeoutError(
            f"{what}: operation {op.operation.name} not done after {timeout:.0f}s",
            hint="it may still finish: check with `tpuops vm describe`",
        ) from None
    except CloudError:
        raise
    except gexc.GoogleAPICallError as e:
        if not op.operation.done:  # the poll itself failed (a 403...), not the operation
            raise api_error(f"poll {what}", e, api) from None
    except Exception as e:  # a web page, cut JSON, no answer in time: one line (answers.failure)
        raise api_error(f"poll {what}", e, api) from None
    return op.operation  # done; an operation that failed carries its `error` (the caller reads it)


def delete_vm(api: Api, zone: str, name: str, timeout: float) -> None:
    """Delete the node, or its queued resource (force) when it came from one; waits for the operation."""
    vm = get_vm(api, zone, name)
    if vm.queued_resource:
        op = api.call(
            f"delete {vm.queued_resource}",
            api.client.delete_queued_resource,
            request={"name": vm.queued_resource, "force": True},
        )
    else:
        op = api.call(f"delete {name}", api.client.delete_node, name=node_name(api, zone, name))
    raw = wait_op(api, op, f"delete {name}", timeout)
    if raw.error.code:
        raise CloudError(f"delete {name}: {raw.error.message}")


def update_metadata(api: Api, vm: VmInfo, metadata: dict[str, str], timeout: float = 300.0) -> None:
    """Replace the node's metadata (update mask `metadata`, as gcloud's tpu-vm ssh does) and wait for it."""
    from google.protobuf import field_mask_pb2

    for node in vm.slices or (vm.name,):  # a multislice: every slice's node gets the same metadata
        op = api.call(
            f"update metadata of {node}",
            api.client.update_node,
            node={"name": node_name(api, vm.zone, node), "metadata": metadata},
            update_mask=field_mask_pb2.FieldMask(paths=["metadata"]),
        )
        raw = wait_op(api, op, f"update metadata of {node}", timeout)
        if raw.error.code:
            raise CloudError(f"update metadata of {node}: {raw.error.message}")
