"""One library call per `tpuops vm` command: config defaults applied, client built, the result returned."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tpuops import config
from tpuops.cloud.autostop import Autostop, check
from tpuops.cloud.client import Api, Notify, connect
from tpuops.cloud.create import CreateRequest, check_slices
from tpuops.cloud.keys import default_user
from tpuops.cloud.locate import find_vm
from tpuops.cloud.tpu_api import VmInfo
from tpuops.cloud.vm_state import delete_vm, wait_state
from tpuops.cloud.zone_cache import remember_zone
from tpuops.cloud.zones import check_zone, known_zones, not_offered
from tpuops.errors import UsageError

if TYPE_CHECKING:
    from tpuops.cloud.backends.base import Backend


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
    """Every backend's VMs (tpuops.cloud.backends) in `zones` (none: every zone): the Cloud TPU API's zones in
    parallel, Compute Engine's two aggregated lists at once; a multislice is one VM with its slices. One API
    refusing (no role, disabled) while another answers is a note, not an error; one that answers broken (a web
    page, cut JSON, nothing in time) is an error: its VMs would be missing from the list without a word."""
    from tpuops.cloud.vm_state import broken, list_all

    api, _ = target.resolve(notify)
    for z in zones:
        check_zone(z, api.endpoint, api)
    found, searched, errors = list_all(api, list(zones))
    if failed := broken(errors):  # an API that answered a web page, cut JSON or nothing: its VMs are unknown
        raise failed[0]
    if errors and not found and len(errors) > 1:
        raise errors[0]
    for skipped in errors:
        notify(f"skipped: {skipped.message}")
    return found, sorted(set(searched) | set(zones) | {v.zone for v in found})


# A MIG's base instance name: its instances are named BASE-xxxx; Compute Engine takes at most 58 characters.
MIG_BASE_MAX = 58


def check_made_names(name: str, slices: int, *, mig: bool) -> None:
    """The names `vm create NAME` makes fit the API's 63 characters (exit 2 before any call): a multislice's
    nodes NAME-0..NAME-(N-1); a MIG's instances NAME-xxxx (and its NAME-tpl, NAME-wp)."""
    from tpuops.config.validators import NODE_NAME

    last = f"{name}-{slices - 1}" if slices > 1 else name
    if slices > 1 and not NODE_NAME.fullmatch(last):
        raise UsageError(
            f"NAME {name!r} with --slices {slices}: its last slice would be {last!r}, over the 63 characters a "
            "TPU VM name may have",
            hint=f"a name of at most {62 - len(str(slices - 1))} characters",
        )
    if mig and len(name) > MIG_BASE_MAX:
        raise UsageError(
            f"NAME {name!r} is {len(name)} characters: a multi-host Compute Engine slice (a MIG) names its "
            f"instances NAME-xxxx, and Compute Engine takes at most {MIG_BASE_MAX} for NAME",
            hint=f"a name of at most {MIG_BASE_MAX} characters",
        )


def describe(target: ApiTarget, name: str, notify: Notify) -> tuple[VmInfo, dict[str, str] | None]:
    """The VM, and its autostop (the setting, and when its watcher will act: cloud/autostop.state; None: off)."""
    from tpuops.cloud import autostop

    api, zone = target.resolve(notify)
    if zone:
        check_zone(zone, api.endpoint, api)
    vm = find_vm(api, name, zone)
    return vm, autostop.state(api, vm)


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
    autostop: Autostop | None = None,
) -> VmInfo:
    """Through the backend the type and `--api` choose (compute_create.choose_api: TPU7x always Compute Engine;
    backends.for_create). The type and zones are checked before any call. With `autostop`, its setting is in the
    VM's metadata from the start and the VM is awaited to READY (its watcher is started over SSH next)."""
    from tpuops.cloud.accelerators import parse
    from tpuops.cloud.backends import for_create
    from tpuops.cloud.compute_create import choose_api

    acc = parse(accelerator_type)  # exit 2 naming the families or the family's sizes, before any call
    check_slices(slices)
    cfg = config.load()
    which = choose_api(accelerator_type, api_name, cfg.api)
    _check_options(which, accelerator_type, runtime_version, slices, image)
    check_made_names(name, slices, mig=which == "compute" and acc.hosts > 1)
    endpoint = target.api_endpoint or cfg.api_endpoint
    wanted = _zones(target, zones, cfg.zone, endpoint, notify)
    ssh_keys = _ssh_keys(ssh_public_key, user)
    api, _ = target.resolve(notify)
    req = CreateRequest(
        name,
        accelerator_type,
        runtime_version or "",
        tuple(wanted),
        spot=spot,
        queued=queued,
        wait=wait,
        slices=slices,
        timeout=timeout,
        ssh_keys=ssh_keys,
        internal_ips=internal_ips,
        autostop=autostop.value if autostop else "",
    )
    backend = for_create(which, acc.hosts, slices)
    if autostop:  # what the VM cannot do to itself is refused before it exists
        shape = VmInfo(name, wanted[0] if wanted else "", api.project, "", "", accelerator_type, "", spot, False,
                       (), queued_resource="queued" if queued else "", kind=backend.kind)  # fmt: skip
        check(shape, autostop)
        req = replace(req, wait=True)
    if backend.api != "tpu":
        notify(f"{name}: {accelerator_type} through {backend.words}")
    vm = _made(backend, api, req, image or "")
    remember_zone(api, name, vm.zone, vm.kind)
    return vm


def _made(backend: Backend, api: Api, req: CreateRequest, image: str) -> VmInfo:
    """The backend's create; a 404 naming one of the zones (or the only one) is "not offered there"."""
    from tpuops.cloud.client import ApiNotFoundError

    try:
        return backend.create(api, req, image)
    except ApiNotFoundError as e:
        wanted = req.zones
        zone = next((z for z in wanted if z in e.message), wanted[0] if len(wanted) == 1 else "")
        if not zone:
            raise
        raise not_offered(req.accelerator_type, zone, api) from None


def _zones(
    target: ApiTarget, zones: list[str], configured: str | None, endpoint: str | None, notify: Notify
) -> list[str]:
    """The zones to try in turn (--zone, else the target's or tpuops.toml's one), each checked: only a zone
    tpuops does not know asks the API."""
    default_zone = target.zone or configured
    wanted: list[str] = list(zones or ([default_zone] if default_zone else []))
    for z in wanted:
        if z in known_zones(endpoint):
            continue
        check_zone(z, endpoint, target.resolve(notify)[0])
    return wanted


def _check_options(
    which: str, accelerator_type: str, runtime_version: str | None, slices: int, image: str | None
) -> None:
    """What the chosen API (`which`: tpu or compute) cannot make, refused before any call."""
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


def _ssh_keys(ssh_public_key: str | None, user: str | None) -> str:
    """The `ssh-keys` metadata line for `--ssh-public-key` (`USER:KEYTYPE BLOB ...`), '' without one."""
    if not ssh_public_key:
        return ""
    path = Path(ssh_public_key).expanduser()
    if not path.is_file():
        raise UsageError(f"--ssh-public-key {ssh_public_key}: no such file")
    return f"{user or default_user()}:{path.read_text().strip()}"


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
        from tpuops.cloud.vm_state import find_in_zone

        found = find_in_zone(api, zone, name, None)
        if found is None:
            return None, zone
    vm = find_vm(api, name, zone)
    return wait_state(api, vm.zone, name, vm.kind, state.upper(), timeout), vm.zone
