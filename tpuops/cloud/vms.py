"""One library call per `tpuops vm` command: config defaults applied, client built, the result returned."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpuops import config
from tpuops.cloud.client import Api, Notify, connect
from tpuops.cloud.create import CreateRequest, check_slices, create_vm
from tpuops.cloud.keys import default_user
from tpuops.cloud.locate import find_vm, remember_zone
from tpuops.cloud.tpu_api import VmInfo, list_vms
from tpuops.cloud.vm_state import delete_vm, wait_state
from tpuops.errors import CloudError, UsageError


@dataclass(frozen=True)
class ApiTarget:
    """Which API and project (and default zone) a vm command talks to; None fields come from the config."""

    project: str | None = None
    api_endpoint: str | None = None
    zone: str | None = None

    def resolve(self, notify: Notify) -> tuple[Api, str | None]:
        cfg = config.load()
        api = connect(self.project or cfg.project, self.api_endpoint or cfg.api_endpoint, notify)
        return api, self.zone or cfg.zone


def list_(target: ApiTarget, zones: list[str], notify: Notify) -> tuple[list[VmInfo], list[str]]:
    """Cloud TPU nodes (explicit zones only; none means every TPU zone in parallel) and Compute Engine TPU VMs
    (two aggregated lists). One API failing while the other answers is a note, not an error."""
    from concurrent.futures import ThreadPoolExecutor

    from tpuops.cloud import compute_api

    api, _ = target.resolve(notify)
    with ThreadPoolExecutor(max_workers=2) as pool:
        tpu = pool.submit(list_vms, api, zones or None)
        compute = pool.submit(compute_api.list_vms, api, zones or None)
        errors: list[CloudError] = []
        found: list[VmInfo] = []
        searched: list[str] = list(zones)
        try:
            nodes, searched = tpu.result()
            found += nodes
        except CloudError as e:
            errors.append(e)
        try:
            found += compute.result()
        except CloudError as e:
            errors.append(e)
    if len(errors) == 2:
        raise errors[0]
    for skipped in errors:
        notify(f"skipped: {skipped.message}")
    return sorted(found, key=lambda v: (v.zone, v.name)), sorted(set(searched) | {v.zone for v in found})


def describe(target: ApiTarget, name: str, notify: Notify) -> VmInfo:
    api, zone = target.resolve(notify)
    return find_vm(api, name, zone)


def create(
    target: ApiTarget,
    name: str,
    *,
    accelerator_type: str,
    runtime_version: str | None,
    zones: list[str],
    spot: bool,
    queued: bool,
    wait: bool,
    timeout: float,
    ssh_public_key: str | None,
    user: str | None,
    notify: Notify,
    internal_ips: bool = False,
    api_name: str | None = None,
    image: str | None = None,
    slices: int = 1,
) -> VmInfo:
    """Through the Cloud TPU API or Compute Engine (compute_create.choose_api: TPU7x always Compute Engine)."""
    from tpuops.cloud.compute_create import choose_api

    check_slices(slices)
    cfg = config.load()
    which = choose_api(accelerator_type, api_name, cfg.api)
    if which == "tpu" and not runtime_version:
        raise UsageError(
            f"creating {accelerator_type} through the Cloud TPU API needs --runtime-version",
            hint="e.g. --runtime-version v2-alpha-tpuv6e (or --api compute for a Compute Engine TPU VM)",
        )
    if which == "compute" and slices > 1:
        raise UsageError(
            f"--slices {slices}: a multislice is made through the Cloud TPU API's queued resources only",
            hint="add --api tpu (TPU7x multislice needs GKE: see docs/scale.md)",
        )
    if which == "tpu" and image:
        raise UsageError("--image is for Compute Engine TPU VMs", hint="add --api compute, or drop --image")
    api, zone = target.resolve(notify)
    ssh_keys = ""
    if ssh_public_key:
        path = Path(ssh_public_key).expanduser()
        if not path.is_file():
            raise UsageError(f"--ssh-public-key {ssh_public_key}: no such file")
        ssh_keys = f"{user or default_user()}:{path.read_text().strip()}"
    req = CreateRequest(
        name,
        accelerator_type,
        runtime_version or "",
        tuple(zones or ([zone] if zone else [])),
        spot=spot,
        queued=queued,
        wait=wait,
        slices=slices,
        timeout=timeout,
        ssh_keys=ssh_keys,
        internal_ips=internal_ips,
    )
    if which == "compute":
        from tpuops.cloud import compute_create

        notify(f"{name}: {accelerator_type} through Compute Engine")
        vm = compute_create.create_vm(api, req, image or "")
    else:
        vm = create_vm(api, req)
    remember_zone(api, name, vm.zone, vm.kind)
    return vm


def delete(target: ApiTarget, name: str, timeout: float, notify: Notify) -> VmInfo:
    api, zone = target.resolve(notify)
    vm = find_vm(api, name, zone)
    delete_vm(api, vm, timeout)
    remember_zone(api, name, None)
    return vm


def wait(
    target: ApiTarget, name: str, state: str, timeout: float, notify: Notify
) -> tuple[VmInfo | None, str]:
    """(VM in `state`, or None once DELETED; its zone)."""
    api, zone = target.resolve(notify)
    if zone and state.upper() == "DELETED":
        from tpuops.cloud.locate import find_in_zone

        found = find_in_zone(api, zone, name, None)
        if found is None:
            return None, zone
    vm = find_vm(api, name, zone)
    return wait_state(api, vm.zone, name, vm.kind, state.upper(), timeout), vm.zone
