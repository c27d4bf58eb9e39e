"""One library call per `tpuops vm` command: config defaults applied, client built, the result returned."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpuops import config
from tpuops.cloud.client import Api, Notify, connect
from tpuops.cloud.create import CreateRequest, create_vm
from tpuops.cloud.keys import default_user
from tpuops.cloud.locate import find_vm, remember_zone
from tpuops.cloud.tpu_api import VmInfo, delete_vm, list_vms, wait_vm
from tpuops.errors import UsageError


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
    """Explicit zones only; none means every TPU zone in parallel (the config's zone is not a filter here)."""
    api, _ = target.resolve(notify)
    return list_vms(api, zones or None)


def describe(target: ApiTarget, name: str, notify: Notify) -> VmInfo:
    api, zone = target.resolve(notify)
    return find_vm(api, name, zone)


def create(
    target: ApiTarget,
    name: str,
    *,
    accelerator_type: str,
    runtime_version: str,
    zones: list[str],
    spot: bool,
    queued: bool,
    wait: bool,
    timeout: float,
    ssh_public_key: str | None,
    user: str | None,
    notify: Notify,
    internal_ips: bool = False,
) -> VmInfo:
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
        runtime_version,
        tuple(zones or ([zone] if zone else [])),
        spot=spot,
        queued=queued,
        wait=wait,
        timeout=timeout,
        ssh_keys=ssh_keys,
        internal_ips=internal_ips,
    )
    vm = create_vm(api, req)
    remember_zone(api, name, vm.zone)
    return vm


def delete(target: ApiTarget, name: str, timeout: float, notify: Notify) -> VmInfo:
    api, zone = target.resolve(notify)
    vm = find_vm(api, name, zone)
    delete_vm(api, vm.zone, name, timeout)
    remember_zone(api, name, None)
    return vm


def wait(
    target: ApiTarget, name: str, state: str, timeout: float, notify: Notify
) -> tuple[VmInfo | None, str]:
    """(VM in `state`, or None once DELETED; its zone)."""
    api, zone = target.resolve(notify)
    zone = zone or find_vm(api, name, None).zone
    return wait_vm(api, zone, name, state.upper(), timeout), zone
