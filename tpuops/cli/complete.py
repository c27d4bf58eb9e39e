"""Shell completion of resource names (bash, zsh, fish): SOP names, run ids (newest first), VM names, zones and
accelerator types. A TAB never calls an API: VM names and zones come from the short-lived cache that `vm list`
and `vm create` write (`remember_vms`), run ids from the run folders, SOP names from the SOP folders."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from tpuops.cloud.tpu_api import VmInfo

CACHE_TTL_S = 8 * 3600.0  # a working day: older VM names are not offered (`tpuops vm list` renews them)
Item = tuple[str, str]  # (value, help): zsh and fish show the help beside the value; bash only the value


def _home() -> Path:
    return Path(os.environ.get("TPUOPS_HOME") or Path.home() / ".tpuops")  # tpuops.config.state_home, cheaply


def cache_file() -> Path:
    return _home() / "cache" / "vms.json"


def remember_vms(vms: Iterable[VmInfo], zones: Iterable[str] = (), *, forget: Iterable[str] = ()) -> None:
    """After `vm list` (every VM found, the zones searched) or `vm create` (the new VM): the names TAB offers.
    A listing replaces what the cache held for the zones it searched; `forget` drops names (`vm delete`).
    Never fails a command: a cache that cannot be written only means no VM names on TAB."""
    from tpuops.config import write_atomic

    listed = list(vms)
    searched = set(zones)
    gone = set(forget)
    try:
        old = _read()
        kept = {n: v for n, v in old["vms"].items() if v.get("zone") not in searched and n not in gone}
        kept.update({v.name: {"zone": v.zone, "accelerator": v.accelerator_type} for v in listed})
        data = {"saved": time.time(), "vms": kept, "zones": sorted(set(old["zones"]) | searched)}
        write_atomic(cache_file(), json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass


class _Cache(TypedDict):
    """The TAB cache's JSON: each VM's zone and accelerator type by name, the zones the last listing searched."""

    vms: dict[str, dict[str, str]]
    zones: list[str]


def _read() -> _Cache:
    """The cache as saved; empty when absent, unreadable or older than CACHE_TTL_S."""
    empty = _Cache(vms={}, zones=[])
    try:
        data = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return empty
    if not isinstance(data, dict) or time.time() - float(data.get("saved", 0)) > CACHE_TTL_S:
        return empty
    vms, zones = data.get("vms"), data.get("zones")
    return _Cache(
        vms={str(n): v for n, v in vms.items() if isinstance(v, dict)} if isinstance(vms, dict) else {},
        zones=[str(z) for z in zones] if isinstance(zones, list) else [],
    )


def _matching(items: Iterable[Item], incomplete: str) -> list[Item]:
    return [(v, h) for v, h in items if v.startswith(incomplete)]


def vm_names(incomplete: str) -> list[Item]:
    """The VMs of the last `vm list` (and those `vm create` made since), with their zone and type."""
    vms = _read()["vms"]
    return _matching(
        ((n, f"{v.get('accelerator', '')} in {v.get('zone', '')}") for n, v in sorted(vms.items())),
        incomplete,
    )


def zones(incomplete: str) -> list[Item]:
    """The TPU zones the last `vm list` searched (the API's own list), and those of the cached VMs."""
    data = _read()
    found = set(data["zones"]) | {v.get("zone", "") for v in data["vms"].values()}
    return _matching(((z, "TPU zone") for z in sorted(found - {""})), incomplete)


def accelerator_types(incomplete: str) -> list[Item]:
    """Every family and slice size tpuops prices (the table `fit` and the cost lines use)."""
    from tpuops.cloud.accelerators import KNOWN_HOSTS
    from tpuops.cloud.price_table import table

    names = set(KNOWN_HOSTS)
    for family, entry in table().get("families", {}).items():
        names.update(f"{family}-{size}" for size in entry.get("slices", {}))

    def order(name: str) -> tuple[str, int]:
        family, _, size = name.rpartition("-")
        return family, int(size) if size.isdigit() else 0

    return _matching(((n, "accelerator type") for n in sorted(names, key=order)), incomplete)


def run_ids(incomplete: str) -> list[Item]:
    """The runs started from this machine, newest first (a run id starts with its start time)."""
    root = _home() / "runs"
    ids = sorted((p.parent.name for p in root.glob("*/run.json")), reverse=True) if root.is_dir() else []
    return _matching(((i, "run") for i in ids), incomplete)


def sop_names(incomplete: str) -> list[Item]:
    """The SOPs `tpuops sop list` shows (the user's sops/ first, then the built-ins), by file name; no SOP is
    loaded, so a TAB stays quick."""
    from tpuops.sop import loader

    names: dict[str, str] = {}
    try:
        dirs = loader.search_dirs(Path.cwd())
    except Exception:  # a broken tpuops.toml must not break TAB: the built-ins still complete
        dirs = [loader.sops_dir()]
    for d in dirs:
        for f in sorted(d.glob("*.yaml")) if d.is_dir() else []:
            names.setdefault(f.stem, "built-in SOP" if d == dirs[-1] else "SOP")
    return _matching(sorted(names.items()), incomplete)
