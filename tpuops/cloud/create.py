"""Create a TPU VM: directly (trying a list of zones in turn on capacity errors) or as a queued resource."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from tpuops.cloud.client import Api
from tpuops.cloud.tpu_api import VmInfo, get_vm, wait_op
from tpuops.cloud.waits import wait_for
from tpuops.errors import CloudError, CommandTimeoutError, UsageError

_CAPACITY = 8  # google.rpc.Code.RESOURCE_EXHAUSTED: no capacity in the zone, or quota
# The most slices one multislice may ask for. The API states no maximum (node_count "needs to be > 1"); the
# largest multislice Google has documented is 199 slices of v5e-256 (50,944 chips, Google Cloud blog, November
# 2023). 256 leaves room above that and refuses a typo such as 1000 before any request is made.
MAX_SLICES = 256
AUTOSTOP_KEY = "tpuops-autostop"  # the VM's metadata that keeps its autostop setting (cloud/autostop.py)
# A request message as the google-cloud clients take it as a dict (its proto field names: `accelerator_type`).
Message = dict[str, "Field"]
Field = str | int | bool | list["Message"] | Message


@dataclass(frozen=True)
class CreateRequest:
    name: str
    accelerator_type: str
    runtime_version: str
    zones: tuple[str, ...]
    spot: bool = False
    queued: bool = False
    wait: bool = False
    timeout: float = 1800.0
    ssh_keys: str = ""  # GCP `ssh-keys` metadata: "user:ssh-ed25519 AAAA... comment" lines
    internal_ips: bool = False  # no external IPs (gcloud's --internal-ips): reached over IAP or the VPC
    slices: int = 1  # > 1: a multislice, one queued resource whose nodes are NAME-0..NAME-(slices-1)
    autostop: str = ""  # the `tpuops-autostop` metadata (cloud/autostop.py): "1800s stop"; "" none


def check_slices(slices: int) -> None:
    """--slices within 1..MAX_SLICES (exit 2), before anything is asked of the API."""
    if not 1 <= slices <= MAX_SLICES:
        raise UsageError(
            f"--slices must be 1 to {MAX_SLICES}, received {slices}",
            hint=f"the largest multislice Google documents has 199 slices; {MAX_SLICES} is tpuops' bound",
        )


def _node(api: Api, req: CreateRequest) -> Message:
    node: Message = {"accelerator_type": req.accelerator_type, "runtime_version": req.runtime_version}
    if req.spot and not req.queued:
        node["scheduling_config"] = {"spot": True}
    metadata: Message = {"ssh-keys": req.ssh_keys} if req.ssh_keys else {}
    if req.autostop:
        metadata[AUTOSTOP_KEY] = req.autostop
    if metadata:
        node["metadata"] = metadata
    if req.internal_ips:
        node["network_config"] = {"network": "default", "enable_external_ips": False}
    return node


def create_vm(api: Api, req: CreateRequest) -> VmInfo:
    """Plain: one create per zone until one has capacity (each operation is awaited, as gcloud does).
    Queued: a queued resource in the one zone, awaited to ACTIVE with --wait."""
    if not req.zones:
        raise UsageError("vm create needs --zone (repeat it to try several zones in turn)")
    check_slices(req.slices)
    if req.queued or req.slices > 1:  # the Cloud TPU API makes a multislice only as a queued resource
        if len(req.zones) > 1:
            what = "--slices" if req.slices > 1 else "--queued"
            raise UsageError(f"{what} takes one --zone: a queued resource waits for capacity in its zone")
        return _create_queued(api, req, req.zones[0])
    refused: list[str] = []
    for zone in req.zones:
        op = api.call(
            f"create {req.name} in {zone}",
            api.client.create_node,
            parent=api.parent(zone),
            node_id=req.name,
            node=_node(api, req),
        )
        raw = wait_op(api, op, f"create {req.name} in {zone}", req.timeout)
        if raw.error.code == _CAPACITY:
            refused.append(zone)
            api.notify(f"{zone}: {raw.error.message}")
            continue
        if raw.error.code:
            raise CloudError(f"create {req.name} in {zone}: {raw.error.message}")
        if req.wait:
            wait_for(
                api, zone, req.name, functools.partial(get_vm, api, zone, req.name), "READY", req.timeout
            )
        return get_vm(api, zone, req.name)
    raise CloudError(
        f"no capacity for {req.accelerator_type} in {', '.join(refused)}",
        hint="try other zones (--zone A --zone B ...), --spot, or --queued to wait for capacity",
    )


def _create_queued(api: Api, req: CreateRequest, zone: str) -> VmInfo:
    parent = api.parent(zone)
    spec: Message = {"parent": parent, "node": _node(api, req)}
    if req.slices > 1:  # nodes PREFIX-0..PREFIX-(n-1), joined over DCN (v2 NodeSpec.multisliceParams)
        spec["multislice_params"] = {"node_count": req.slices, "node_id_prefix": req.name}
    else:
        spec["node_id"] = req.name
    qr: Message = {"tpu": {"node_spec": [spec]}}
    if req.spot:
        qr["spot"] = {}
    op = api.call(
        f"queue {req.name} in {zone}",
        api.client.create_queued_resource,
        parent=parent,
        queued_resource_id=req.name,
        queued_resource=qr,
    )
    raw = wait_op(api, op, f"queue {req.name}", min(req.timeout, 300))
    if raw.error.code:
        raise CloudError(f"queue {req.name} in {zone}: {raw.error.message}")
    qr_name = f"{parent}/queuedResources/{req.name}"
    state = _qr_state(api, qr_name)
    if not req.wait:
        api.notify(f"queued resource {req.name}: {state}")
        return _placeholder(api, req, zone, state)
    start, interval, seen = time.monotonic(), 0.05, ""
    while state != "ACTIVE":
        if state != seen:
            api.notify(f"queued resource {req.name}: {state} after {time.monotonic() - start:.1f}s")
            seen = state
        if state in ("FAILED", "SUSPENDED"):
            raise CloudError(
                f"queued resource {req.name} in {zone} is {state}", hint="delete it and queue again"
            )
        if time.monotonic() - start > req.timeout:
            raise CommandTimeoutError(
                f"queued resource {req.name} still {state} after {req.timeout:.0f}s",
                hint="it stays queued; check later with tpuops vm describe",
            )
        time.sleep(interval)
        interval = min(5.0, interval * 1.5)
        state = _qr_state(api, qr_name)
    return wait_for(
        api,
        zone,
        req.name,
        lambda: get_vm(api, zone, req.name),
        "READY",
        max(1.0, req.timeout - (time.monotonic() - start)),
    ) or get_vm(api, zone, req.name)


def _qr_state(api: Api, name: str) -> str:
    return str(api.call(f"get {name}", api.client.get_queued_resource, name=name).state.state.name)


def _placeholder(api: Api, req: CreateRequest, zone: str, state: str) -> VmInfo:
    """A queued VM has no node yet: describe it by its queued resource's state."""
    return VmInfo(
        slices=tuple(f"{req.name}-{i}" for i in range(req.slices)) if req.slices > 1 else (),
        name=req.name,
        zone=zone,
        project=api.project,
        state=f"QUEUED:{state}",
        health="",
        accelerator_type=req.accelerator_type,
        runtime_version=req.runtime_version,
        spot=req.spot,
        preemptible=False,
        workers=(),
        queued_resource=f"{api.parent(zone)}/queuedResources/{req.name}",
    )
