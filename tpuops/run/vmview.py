"""What `tpuops vm` and `tpuops emulator` show: tables on stderr (through console.py), JSON on stdout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NotRequired, TypedDict, cast

from tpuops.cloud.backends import backend_of
from tpuops.console import Col, emit_json, err, escape, grid, out, table_of

if TYPE_CHECKING:
    from tpuops.cloud.tpu_api import VmInfo
    from tpuops.run.autostop import Applied


def vm_list(vms: list[VmInfo], zones: list[str], as_json: bool) -> None:
    if as_json:
        emit_json({"ok": True, "zones_searched": zones, "vms": [v.to_dict() for v in vms]})
        return
    # At 80 columns every name, zone, type, state and count stays whole; spot, api and health give way first.
    cols = [Col("name"), Col("zone"), Col("api", "wrap", 2), Col("type"), Col("state"), Col("health", drop=1),
            Col("spot", drop=3), Col("workers", justify="right")]  # fmt: skip
    rows = []
    for v in vms:
        spot = "spot" if v.spot else "preemptible" if v.preemptible else ""
        api = backend_of(v).label
        workers = f"{len(v.workers)} ({len(v.slices)} slices)" if v.slices else str(len(v.workers))
        rows.append([v.name, v.zone, api, v.accelerator_type, v.state, v.health, spot, workers])
    err.print(
        table_of(
            cols, rows, err.width, title=f"{len(vms)} TPU VMs in {len(zones)} zones", title_justify="left"
        )
    )


def vm_describe(vm: VmInfo, as_json: bool, verb: str = "", autostop: dict[str, str] | None = None) -> None:
    """`autostop`: cloud/autostop.state's, or what `create --autostop` set; shown by describe (None: off) and
    by a create that set it."""
    if as_json:
        more = {"autostop": autostop} if not verb or autostop else {}
        emit_json({"ok": True, **({"action": verb} if verb else {}), "vm": vm.to_dict(), **more})
        return
    rows = [
        ("name", vm.name),
        ("zone", vm.zone),
        ("project", vm.project),
        ("api", backend_of(vm).words),
        ("state", vm.state + (f" (instances: {vm.status})" if vm.status else "")),
        ("health", vm.health),
        ("accelerator type", vm.accelerator_type),
        *backend_of(vm).detail_rows(vm),
        ("spot / preemptible", f"{'yes' if vm.spot else 'no'} / {'yes' if vm.preemptible else 'no'}"),
        ("workers", str(len(vm.workers))),
    ]
    if not verb or autostop:
        rows.append(("autostop", f"{autostop['words']}; {autostop['status']}" if autostop else "off"))
    for w in vm.workers:
        where = f"internal {w.internal_ip}  external {w.external_ip or '-'}"
        if vm.slices:
            where = f"slice {w.slice}  {where}"
        if vm.instances:
            where += f"  instance {vm.instances[w.index]}"
        rows.append((f"w{w.index}", where))
    title = f"{verb + ' ' if verb else ''}{vm.name}"
    table = grid(
        ["field", "value"],
        [(k, escape(v)) for k, v in rows],
        title=title,
        title_justify="left",
        show_header=False,
    )
    err.print(table)


def autostop_set(applied: Applied, as_json: bool) -> None:
    """`tpuops vm autostop`'s answer (run/autostop.Applied)."""
    if as_json:
        emit_json({"ok": True, "action": "autostop", **applied.to_dict()})
        return
    setting = applied.setting.words if applied.setting else "off"
    err.print(f"{applied.vm.name}: autostop {escape(setting)} (watcher on w0: {escape(applied.watcher)})")


def vm_deleted(name: str, zone: str, as_json: bool) -> None:
    if as_json:
        emit_json({"ok": True, "action": "deleted", "name": name, "zone": zone})
        return
    err.print(f"deleted {name} in {zone}")


def vm_gone(name: str, zone: str, as_json: bool) -> None:
    if as_json:
        emit_json({"ok": True, "action": "waited", "name": name, "zone": zone, "state": "DELETED"})
        return
    err.print(f"{name} in {zone} is gone")


def emulator_started(url: str, identity: str, zones: list[str], state_dir: str) -> None:
    """What to paste: the export line on stdout (so `eval $(tpuops emulator serve ...)` style use works)."""
    out.print(f"export TPUOPS_TPU_API={url}", highlight=False)
    err.print(f"TPU API emulator on {url} (state in {state_dir}); zones: {', '.join(zones)}")
    err.print(f"SSH identity for its VMs: --identity {identity}")
    err.print(
        "create a VM: tpuops vm create demo --accelerator v4-16 --zone us-east1-d --runtime-version base"
    )
    err.print("Ctrl-C stops it and every emulated worker.")


class EmulatorState(TypedDict):
    """The emulator's `state` answer (cloud/emulator/control.py): each resource's state, the pending faults."""

    nodes: dict[str, str]
    instances: NotRequired[dict[str, str]]
    queuedResources: dict[str, str]
    faults: object


def emulator_state(answer: Mapping[str, object], as_json: bool) -> None:
    if as_json:
        emit_json({"ok": True, **answer})
        return
    state = cast(EmulatorState, answer)
    named = {**state["nodes"], **state.get("instances", {}), **state["queuedResources"]}
    table = grid(["resource", "state"], list(named.items()), title="emulator", title_justify="left")
    err.print(table)
    err.print(f"pending faults: {state['faults']}")
