"""Create a TPU VM on Compute Engine: one instance for a single-host slice; for a multi-host slice an instance
template, a workload policy naming the accelerator topology, and a MIG of the VMs. Spot = the Spot provisioning
model. Which API a create uses: TPU7x always Compute Engine, the others the Cloud TPU API unless asked."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from tpuops.cloud import compute_api as cc
from tpuops.cloud import compute_client as cx
from tpuops.cloud.accelerators import Shape, compute_shape
from tpuops.cloud.client import Api
from tpuops.cloud.compute_api import policy_name, region_of, template_name
from tpuops.cloud.create import AUTOSTOP_KEY, CreateRequest, Message
from tpuops.cloud.tpu_api import VmInfo
from tpuops.errors import CloudError, UsageError

if TYPE_CHECKING:
    from google.api_core.extended_operation import ExtendedOperation

Made = list[
    tuple[str, Callable[..., "ExtendedOperation"], dict[str, str]]
]  # (what, its delete, its arguments)

# The boot image when --image is not given. Google's pages do not name one image family for TPU machine types
# on Compute Engine (docs/cloud.md says so): an Ubuntu LTS the TPU runtime (libtpu from PyPI) installs on.
DEFAULT_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
APIS = ("tpu", "compute")
COMPUTE_ONLY = ("tpu7x",)  # "the Cloud TPU API is not supported on TPU7x and later"


def choose_api(accelerator_type: str, flag: str | None, configured: str | None) -> str:
    """`--api`, else tpuops.toml's `api`, else the Cloud TPU API, except TPU7x and later: Compute Engine."""
    for value, where in ((flag, "--api"), (configured, "api in tpuops.toml")):
        if value and value not in APIS:
            raise UsageError(f"{where} {value!r}: expected tpu or compute")
    family = accelerator_type.split("-", 1)[0]
    if family in COMPUTE_ONLY:
        if flag == "tpu":
            raise UsageError(
                f"{accelerator_type}: the Cloud TPU API does not serve {family.upper()}",
                hint="drop --api tpu: TPU7x VMs are Compute Engine instances (--api compute)",
            )
        return "compute"
    return flag or configured or "tpu"


def _properties(req: CreateRequest, machine: str, image: str) -> Message:
    """An instance's (or a template's) properties: machine type, boot disk, network, scheduling, metadata."""
    nic: Message = {"network": "global/networks/default"}
    if not req.internal_ips:
        nic["access_configs"] = [{"type_": "ONE_TO_ONE_NAT", "name": "External NAT"}]
    scheduling: Message = {"on_host_maintenance": "TERMINATE", "automatic_restart": not req.spot}
    if req.spot:
        scheduling.update(provisioning_model="SPOT", instance_termination_action="STOP")
    items: list[Message] = [
        {"key": "enable-guest-attributes", "value": "TRUE"},
        {"key": cc.IMAGE_KEY, "value": image},
    ]
    if req.ssh_keys:
        items.append({"key": "ssh-keys", "value": req.ssh_keys})
    if req.autostop:
        items.append({"key": AUTOSTOP_KEY, "value": req.autostop})
    return {
        "machine_type": machine,
        "disks": [{"boot": True, "auto_delete": True,
                   "initialize_params": {"source_image": image, "disk_size_gb": 100}}],
        "network_interfaces": [nic],
        "scheduling": scheduling,
        "metadata": {"items": items},
    }  # fmt: skip


def create_vm(api: Api, req: CreateRequest, image: str = "") -> VmInfo:
    """One zone after another until one has capacity (each operation awaited with `operation.result()`); a
    multi-host slice's template and workload policy are made once per zone tried and deleted on failure."""
    if not req.zones:
        raise UsageError("vm create needs --zone (repeat it to try several zones in turn)")
    if req.queued:
        raise UsageError(
            "--queued is the Cloud TPU API's queued resources", hint="drop --queued with --api compute"
        )
    shape = compute_shape(req.accelerator_type)
    image = image or req.runtime_version or DEFAULT_IMAGE
    refused: list[str] = []
    for zone in req.zones:
        try:
            if shape.vms == 1:
                _instance(api, req, zone, shape.machine_type, image)
            else:
                _mig(api, req, zone, shape, image)
        except CloudError as e:
            if not cx.capacity_error(e):
                raise
            refused.append(zone)
            api.notify(f"{zone}: {e.message}")
            continue
        if req.wait:
            from tpuops.cloud.waits import wait_for

            get = cc.get_instance if shape.vms == 1 else cc.get_mig
            vm = wait_for(
                api, zone, req.name, functools.partial(get, api, zone, req.name), "READY", req.timeout
            )
            assert vm is not None
            return vm
        return cc.get_instance(api, zone, req.name) if shape.vms == 1 else cc.get_mig(api, zone, req.name)
    raise CloudError(
        f"no capacity for {req.accelerator_type} ({shape.machine_type}) in {', '.join(refused)}",
        hint="try other zones (--zone A --zone B ...) or --spot",
    )


def _instance(api: Api, req: CreateRequest, zone: str, machine: str, image: str) -> None:
    c = cx.clients(api)
    body = {"name": req.name, **_properties(req, f"zones/{zone}/machineTypes/{machine}", image)}
    op = cx.call(
        api, f"create {req.name} in {zone}", c.instances.insert, project=api.project, zone=zone,
        instance_resource=body,
    )  # fmt: skip
    cx.wait_op(api, op, f"create {req.name} in {zone}", req.timeout)


def _mig(api: Api, req: CreateRequest, zone: str, shape: Shape, image: str) -> None:
    """Template (global) + workload policy (regional, HIGH_THROUGHPUT, the topology) + MIG (zonal)."""
    c = cx.clients(api)
    region = region_of(zone)
    tpl, wp = template_name(req.name), policy_name(req.name)
    made: Made = []
    try:
        op = cx.call(
            api, f"create template {tpl}", c.templates.insert, project=api.project,
            instance_template_resource={"name": tpl, "properties": _properties(req, shape.machine_type, image)},
        )  # fmt: skip
        cx.wait_op(api, op, f"create template {tpl}", req.timeout)
        made.append(("template", c.templates.delete, {"instance_template": tpl}))
        policy = {
            "name": wp,
            "workload_policy": {"type_": "HIGH_THROUGHPUT", "accelerator_topology": shape.topology},
        }
        op = cx.call(
            api, f"create workload policy {wp}", c.policies.insert, project=api.project, region=region,
            resource_policy_resource=policy,
        )  # fmt: skip
        cx.wait_op(api, op, f"create workload policy {wp}", req.timeout)
        made.append(("workload policy", c.policies.delete, {"region": region, "resource_policy": wp}))
        mig = {
            "name": req.name, "base_instance_name": req.name, "target_size": shape.vms,
            "instance_template": f"projects/{api.project}/global/instanceTemplates/{tpl}",
            "resource_policies": {"workload_policy": f"projects/{api.project}/regions/{region}/resourcePolicies/{wp}"},
        }  # fmt: skip
        op = cx.call(
            api, f"create MIG {req.name} in {zone}", c.migs.insert, project=api.project, zone=zone,
            instance_group_manager_resource=mig,
        )  # fmt: skip
        cx.wait_op(api, op, f"create MIG {req.name} in {zone}", req.timeout)
    except CloudError:
        _undo(api, req.name, zone, made)
        raise


def _undo(api: Api, name: str, zone: str, made: Made) -> None:
    """A failed slice leaves nothing behind: its MIG (if any) and what was made for it, newest first."""
    from tpuops.cloud.client import ApiNotFoundError

    c = cx.clients(api)
    steps = [("MIG", c.migs.delete, {"zone": zone, "instance_group_manager": name}), *reversed(made)]
    for what, fn, kw in steps:
        try:
            op = cx.call(api, f"delete {what} of {name}", fn, project=api.project, **kw)
            cx.wait_op(api, op, f"delete {what} of {name}", 300.0)
        except ApiNotFoundError:
            continue
        except CloudError as e:
            api.notify(f"cleaning up {name}: {e.message}")
