"""`--vm NAME [--zone Z]` -> one Worker per TPU host: the name found as a Cloud TPU node, a Compute Engine
instance with a TPU machine type, or a MIG slice; host keys pinned from guest attributes, the route (external
IP, internal IP, IAP) chosen, the key authorised at first connection."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tpuops.cloud.backends import Listing, backend_of
from tpuops.cloud.client import Api, ApiNotFoundError, Notify, connect
from tpuops.cloud.keys import default_user
from tpuops.cloud.tpu_api import VmInfo, WorkerAddr
from tpuops.cloud.vm_state import broken, find_in_zone, get_vm, list_all, search
from tpuops.cloud.zone_cache import _cached, cached_zone, remember_zone

__all__ = [
    "Reach",
    "cached_zone",
    "find_vm",
    "how_to_recreate",
    "locate_workers",
    "reach",
    "reach_recorded",
    "remember_zone",
]
from tpuops.config import TargetSpec
from tpuops.errors import CloudError, ConnectError, PreemptedError, UsageError
from tpuops.transport.base import Prepared, Worker

if TYPE_CHECKING:
    from tpuops.cloud.iap import Tunnels

_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa")  # paramiko's preference order


def _not_found(name: str, where: str, vms: list[VmInfo], hint_zone: bool) -> CloudError:
    """Not found: the close names (with zone and API) or the VMs there, of every backend."""
    names = sorted({v.name for v in vms})
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if close:
        zones = {v.name: v.zone for v in vms}
        hint = "did you mean " + ", ".join(f"{c} ({zones[c]})" for c in close) + "?"
    else:
        listed = [f"{v.name} ({backend_of(v).words})" for v in sorted(vms, key=lambda v: v.name)]
        hint = f"VMs there: {', '.join(listed[:8])}" if listed else "no TPU VMs there"
        hint += " (searched Cloud TPU nodes and multislices, Compute Engine TPU instances and MIGs)"
    if hint_zone:
        hint += "; omit --zone to search every zone"
    return CloudError(f"TPU VM {name!r} not found in {where}", hint=hint)


def _get(api: Api, zone: str, name: str, kind: str) -> VmInfo | None:
    try:
        return get_vm(api, zone, name, kind)
    except ApiNotFoundError:
        return None


def _there(api: Api, zones: list[str], listing: Listing | None = None) -> tuple[list[VmInfo], int]:
    """(the VMs of every backend in `zones` (all when empty), TPU zones searched): a not-found's hint.
    Raises only when every API failed."""
    vms, searched, errors = list_all(api, zones, listing)
    if broken(errors) or (errors and not vms and len(errors) > 1):
        raise (broken(errors) or errors)[0]
    return vms, len(searched)


def find_vm(api: Api, name: str, zone: str | None) -> VmInfo:
    """Get the VM in `zone`; without one use the cached zone (and kind), else search every zone at once."""
    entry = _cached(api, name)
    if zone:
        vm = find_in_zone(api, zone, name, entry["kind"] if entry and entry["zone"] == zone else None)
        if vm is None:
            raise _not_found(name, f"zone {zone}", _there(api, [zone])[0], hint_zone=True)
        remember_zone(api, name, zone, vm.kind)
        return vm
    if entry:
        vm = _get(api, entry["zone"], name, entry.get("kind", "node"))
        if vm is not None:
            return vm
        remember_zone(api, name, None)
    listing = Listing([])
    hits, errors = search(api, name, listing)
    if not hits:
        if broken(errors) or (errors and len(errors) > 1):  # an API did not answer: say why, not "not found"
            raise (broken(errors) or errors)[0]
        vms, n_zones = _there(api, [], listing)
        raise _not_found(name, f"any of {n_zones} zones of project {api.project}", vms, hint_zone=False)
    if len(hits) > 1:
        mixed = len({v.kind for v in hits}) > 1
        where = ", ".join(f"{v.zone} ({backend_of(v).words})" if mixed else v.zone for v in hits)
        raise UsageError(
            f"TPU VM {name!r} exists in several zones: {where}", hint=f"pass --zone {hits[0].zone}"
        )
    remember_zone(api, name, hits[0].zone, hits[0].kind)
    return hits[0]


def check_ready(vm: VmInfo) -> None:
    if vm.state == "READY":
        return
    if backend_of(vm).repairs_itself and vm.state in ("PREEMPTED", "REPAIRING"):
        raise PreemptedError(
            f"TPU VM {vm.name} in {vm.zone} is {vm.state}: some of its instances were preempted or are being "
            "recreated",
            hint=how_to_recreate(vm),
        )
    if vm.state == "PREEMPTED":
        raise PreemptedError(f"TPU VM {vm.name} in {vm.zone} was preempted", hint=how_to_recreate(vm))
    raise CloudError(
        f"TPU VM {vm.name} in {vm.zone} is {vm.state}, not READY",
        hint=f"wait for it: tpuops vm wait {vm.name} --zone {vm.zone} --state READY",
    )


def how_to_recreate(vm: VmInfo) -> str:
    """What makes a lost VM whole again, as commands: a MIG's slice repairs itself (wait for it); any other is
    deleted and created again with the same shape."""
    if backend_of(vm).repairs_itself:
        return f"its MIG recreates them: tpuops vm wait {vm.name} --zone {vm.zone} --state READY"
    shape = f" --type {vm.accelerator_type}" if vm.accelerator_type else ""
    shape += f" --slices {len(vm.slices)}" if len(vm.slices) > 1 else ""
    shape += " --spot" if vm.spot else ""
    return (
        f"recreate it: tpuops vm delete {vm.name} --zone {vm.zone} --yes, then "
        f"tpuops vm create {vm.name} --zone {vm.zone}{shape}"
    )


def pinned_fingerprints(attrs: list[dict[str, dict[str, str]]]) -> list[str | None]:
    """Each worker's host key fingerprint from guest attributes namespace `hostkeys` (None if absent)."""
    from tpuops.transport.hostkeys import fingerprint_of_public_line  # paramiko: only when connecting

    out: list[str | None] = []
    for per in attrs:
        keys = per.get("hostkeys", {})
        kind = next((k for k in _KEY_TYPES if k in keys), None)
        out.append(fingerprint_of_public_line(f"{kind} {keys[kind].split()[-1]}") if kind else None)
    return out


def workers_of(
    vm: VmInfo, attrs: list[dict[str, dict[str, str]]], spec: TargetSpec, notify: Notify
) -> list[Worker]:
    """Workers in index order, each with its internal IP (the multi-host coordinator's address). A user-given
    fingerprint (spec.hostkey) overrides the guest attributes; with an emulator endpoint the emulator's
    namespace supplies each worker's sshd port (and, for metadata keys, its Unix user)."""
    if spec.hostkey and len(spec.hostkey) != len(vm.workers):
        raise UsageError(f"got {len(spec.hostkey)} host keys for {vm.name}'s {len(vm.workers)} workers")
    pins = list(spec.hostkey) if spec.hostkey else pinned_fingerprints(attrs)
    pins += [None] * (len(vm.workers) - len(pins))
    workers = []
    for w, pin in zip(vm.workers, pins, strict=True):
        extra = _emulator_attrs(spec, attrs, w.index)
        host = w.internal_ip if spec.internal_ip or not w.external_ip else w.external_ip
        user = spec.user or extra.get("ssh-user") or default_user()
        port = int(extra.get("ssh-port", 22))
        workers.append(
            Worker(
                w.index,
                host,
                port,
                user,
                pin,
                internal_host=w.internal_ip,
                slice_index=w.slice,
                peer_host=extra.get("peer-host"),
            )
        )
    return workers


def _emulator_attrs(spec: TargetSpec, attrs: list[dict[str, dict[str, str]]], index: int) -> dict[str, str]:
    return attrs[index].get("tpuops-emulator", {}) if spec.api_endpoint and index < len(attrs) else {}


def route_of(vm: VmInfo, spec: TargetSpec, notify: Notify) -> str:
    """external, internal or iap: gcloud's choice, plus IAP on its own when a worker has no external IP."""
    if spec.tunnel_through_iap and spec.internal_ip:
        raise UsageError("--tunnel-through-iap and --internal-ip were both given: choose one")
    if spec.tunnel_through_iap:
        return "iap"
    if spec.internal_ip:
        return "internal"
    bare = [f"w{w.index}" for w in vm.workers if not w.external_ip]
    if bare:
        notify(
            f"{vm.name}: {', '.join(bare)} {'has' if len(bare) == 1 else 'have'} no external IP; tunnelling "
            "through IAP (from inside the VPC pass --internal-ip instead)"
        )
        return "iap"
    return "external"


def instance_names(vm: VmInfo, attrs: list[dict[str, dict[str, str]]]) -> list[str]:
    """Each worker's Compute Engine instance name (what IAP tunnels to), as its backend knows it."""
    return backend_of(vm).instance_names(vm, attrs)


NOT_READ = "not read: a dry run logs in only with a key the VM already accepts (the run adds it)"


@dataclass
class Reach:
    """How tpuops reaches one VM. `workers` are known without side effects (plans, the watch); `prepare()`
    runs at the first connection: the identity, the key (OS Login or metadata), the IAP tunnels."""

    api: Api
    vm: VmInfo
    attrs: list[dict[str, dict[str, str]]]
    spec: TargetSpec
    route: str
    workers: list[Worker]
    notify: Notify
    read_only: bool = False  # a dry run: `prepare` changes nothing (no key made, pushed or imported)
    # Reached by a run's recorded route (`reach_recorded`): the key its workers accepted then; `prepare` asks
    # no API and pushes no key, and opens the tunnels to `tunnel_to` (iap) again.
    recorded: Path | None = None
    tunnel_to: tuple[str, ...] = ()

    def watch_endpoints(self) -> list[tuple[str, int]]:
        """What the recovery watch may probe with TCP: nothing behind IAP (a local tunnel always answers)."""
        return [] if self.route == "iap" else [(w.host, w.port) for w in self.workers]

    def prepare(self) -> Prepared:
        from tpuops.cloud.access import authorize
        from tpuops.cloud.keys import default_identity, ensure_identity

        if self.recorded is not None:
            return self._prepare_recorded(self.recorded)
        if self.read_only and not self.spec.identity and not default_identity().exists():
            self.notify(f"would generate SSH key {default_identity()} (ed25519), as gcloud would")
            raise ConnectError(NOT_READ)
        identity = ensure_identity(self.spec.identity, self.notify)
        auth = authorize(
            self.api,
            self.vm,
            identity,
            user=self.spec.user,
            key_push=self.spec.key_push is not False,  # None: not given, the default is to push
            key_ttl=self.spec.key_ttl,
            notify=self.notify,
            dry_run=self.read_only,
        )
        if auth.pending:  # a dry run: the workers cannot be read with a key they do not accept yet
            raise ConnectError(NOT_READ)
        workers = []
        for w in self.workers:
            # OS Login names the user; with metadata keys --user wins, then the emulator's fixed Unix user.
            fixed = _emulator_attrs(self.spec, self.attrs, w.index).get("ssh-user")
            user = auth.user if auth.via == "oslogin" else self.spec.user or fixed or auth.user
            workers.append(replace(w, user=user))
        tunnels = None
        if self.route == "iap":
            tunnels, workers = self._tunnelled(workers, instance_names(self.vm, self.attrs))
        return Prepared(
            workers,
            identity.path,
            tunnels.close if tunnels else None,
            auth_grace_s=60.0 if auth.pushed else 0.0,
        )

    def _prepare_recorded(self, key: Path) -> Prepared:
        """The recorded route's first connection: its key, its users, the tunnels again (iap); no API call."""
        if not key.is_file():
            raise ConnectError(f"the SSH key {key} the run logged in with is gone")
        if self.route != "iap":
            return Prepared(list(self.workers), key)
        tunnels, workers = self._tunnelled(list(self.workers), list(self.tunnel_to))
        return Prepared(workers, key, tunnels.close)

    def _tunnelled(self, workers: list[Worker], instances: list[str]) -> tuple[Tunnels, list[Worker]]:
        """One IAP tunnel per worker; the workers as reached through them."""
        from tpuops.cloud.iap import Tunnels

        tunnels = Tunnels(self.vm.project, self.vm.zone)
        ports = tunnels.open_all(instances)
        workers = [replace(w, host="127.0.0.1", port=p) for w, p in zip(workers, ports, strict=True)]
        self.notify(
            f"{self.vm.name}: IAP tunnels up: "
            + ", ".join(f"w{w.index} -> {w.host}:{w.port}" for w in workers)
        )
        return tunnels, workers


def reach(spec: TargetSpec, notify: Notify | None = None, api: Api | None = None) -> Reach:
    """Find the VM (zone searched and cached when omitted), require READY, read its guest attributes (host
        keys, instance names) and pick the route; nothing on the VM or its metadata changes here. One get_node
        (with --zone or a cached zone) and one guest-attributes call; on Compute Engine one call per kind (an
    instance's get, or a MIG's get, its managed instances and one instances.list) and one guest-attributes read per
    instance. `api` None: a client is made for `spec`."""
    if notify is None:
        from tpuops.console import note

        notify = note
    if not spec.vm:
        raise UsageError("locate_workers needs --vm NAME")
    api = api or connect(spec.project, spec.api_endpoint, notify)
    vm = find_vm(api, spec.vm, spec.zone)
    check_ready(vm)
    attrs = guest_attributes(api, vm)
    route = route_of(vm, spec, notify)
    return Reach(api, vm, attrs, spec, route, workers_of(vm, attrs, spec, notify), notify)


def reach_recorded(
    spec: TargetSpec,
    vm: Mapping[str, object],
    via: str,
    workers: list[Worker],
    key: Path,
    tunnel_to: tuple[str, ...] = (),
    notify: Notify | None = None,
) -> Reach:
    """The VM as a run reached it (`vm`: the VmInfo.to_dict it resolved; `via`, `workers`, `key`: its route and
    logins), with no cloud API call: the client is made, nothing is asked of it until the VM watch polls."""
    if notify is None:
        from tpuops.console import note

        notify = note
    info = vm_from_record(vm)
    api = connect(info.project or spec.project, spec.api_endpoint, notify)
    return Reach(api, info, [], spec, via, workers, notify, recorded=key, tunnel_to=tunnel_to)


def vm_from_record(d: Mapping[str, object]) -> VmInfo:
    """A VmInfo again from its `to_dict` (as a run record keeps it; a field it lacks keeps its default)."""

    def text(key: str) -> str:
        v = d.get(key)
        return v if isinstance(v, str) else ""

    def texts(key: str) -> tuple[str, ...]:
        v = d.get(key)
        return tuple(str(x) for x in v) if isinstance(v, list | tuple) else ()

    def addr(w: object) -> WorkerAddr:
        m = w if isinstance(w, Mapping) else {}
        port, index, sl = m.get("port"), m.get("index"), m.get("slice")
        external = m.get("external_ip")
        return WorkerAddr(
            index if isinstance(index, int) else 0, str(m.get("internal_ip") or ""),
            external if isinstance(external, str) else None, port if isinstance(port, int) else 22,
            sl if isinstance(sl, int) else 0,
        )  # fmt: skip

    listed = d.get("workers")
    return VmInfo(
        name=text("name"), zone=text("zone"), project=text("project"), state=text("state"), health=text("health"),
        accelerator_type=text("accelerator_type"), runtime_version=text("runtime_version"),
        spot=d.get("spot") is True, preemptible=d.get("preemptible") is True,
        workers=tuple(addr(w) for w in listed) if isinstance(listed, list) else (),
        queued_resource=text("queued_resource"), create_time=text("create_time"), slices=texts("slices"),
        api=text("api") or "tpu", kind=text("kind") or "node", machine_type=text("machine_type"),
        topology=text("topology"), status=text("status"), instances=texts("instances"),
        instance_ids=texts("instance_ids"),
    )  # fmt: skip


def guest_attributes(api: Api, vm: VmInfo) -> list[dict[str, dict[str, str]]]:
    """Per worker: {namespace: {key: value}}, as its backend reads them (a node: one call for every worker;
    Compute Engine: one per instance, at once)."""
    return backend_of(vm).guest_attributes(api, vm)


def locate_workers(spec: TargetSpec, notify: Notify | None = None) -> list[Worker]:
    """The SOP target for `--vm`, before any key or tunnel (see `reach`)."""
    return reach(spec, notify).workers
