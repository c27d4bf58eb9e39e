"""Accelerator types (v4-8, v6e-16, tpu7x-8, ...) -> how many TPU-VM hosts (workers) a slice has, and the
Compute Engine machine type and accelerator topology of the same slice (and back)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from tpuops.errors import UsageError


@dataclass(frozen=True)
class Family:
    """How a family counts its slice size and packs it onto hosts.

    `unit` is what the number after the dash counts (TensorCores or chips); a slice up to
    `single_host_max` units is one host, a bigger one has `size / per_host` hosts.
    """

    unit: str
    per_host: int
    single_host_max: int


# From the Cloud TPU docs' system-architecture pages: v2/v3/v4/v5p name TensorCores (8 per host:
# 4 chips x 2 cores); v5e (v5litepod) and v6e name chips, up to 8 on one host, 4 per host in bigger slices.
FAMILIES: dict[str, Family] = {
    "v2": Family("cores", 8, 8),
    "v3": Family("cores", 8, 8),
    "v4": Family("cores", 8, 8),
    "v5p": Family("cores", 8, 8),
    "v5litepod": Family("chips", 4, 8),
    "v5e": Family("chips", 4, 8),
    "v6e": Family("chips", 4, 8),
    "tpu7x": Family("cores", 8, 8),  # TPU7x names TensorCores as xpk and GKE do: tpu7x-8 = 4 chips (2x2x1)
}

# Worked examples of the rule above, checked by the tests against worker_count().
KNOWN_HOSTS: dict[str, int] = {
    "v2-8": 1, "v3-8": 1, "v3-32": 4,
    "v4-8": 1, "v4-16": 2, "v4-32": 4, "v4-64": 8,
    "v5p-8": 1, "v5p-16": 2,
    "v5litepod-1": 1, "v5litepod-4": 1, "v5litepod-8": 1, "v5litepod-16": 4, "v5litepod-256": 64,
    "v6e-1": 1, "v6e-4": 1, "v6e-8": 1, "v6e-16": 4, "v6e-32": 8, "v6e-256": 64,
    "tpu7x-8": 1, "tpu7x-16": 2, "tpu7x-128": 16,
}  # fmt: skip


@dataclass(frozen=True)
class AcceleratorType:
    """One accelerator type, parsed and checked: `v5litepod-16` -> family v5litepod, size 16."""

    family: str  # as the API names it (v5litepod, not v5e)
    size: int  # what FAMILIES[family].unit counts

    @property
    def name(self) -> str:
        return f"{self.family}-{self.size}"

    @property
    def price_family(self) -> str:
        """The family as prices and Compute Engine name it: v5litepod -> v5e."""
        return "v5e" if self.family == "v5litepod" else self.family

    @property
    def chips(self) -> int:
        return self.size // 2 if FAMILIES[self.family].unit == "cores" else self.size

    @property
    def hosts(self) -> int:
        fam = FAMILIES[self.family]
        return 1 if self.size <= fam.single_host_max else self.size // fam.per_host


def known_sizes(family: str) -> list[int]:
    """The sizes of a family tpuops knows: the shipped price table's slices, the worked examples above, and
    (for the families Compute Engine serves) every topology it knows. `family` as the API names it."""
    fam = "v5e" if family == "v5litepod" else family
    sizes = {int(k.rsplit("-", 1)[1]) for k in KNOWN_HOSTS if k.rsplit("-", 1)[0] in (family, fam)}
    sizes |= set(_priced_sizes().get(fam, ()))
    if family in MACHINE_PREFIX:
        per_chip = 2 if FAMILIES[family].unit == "cores" else 1
        topologies = _TOPOLOGY_3D if family in THREE_D else _TOPOLOGY_2D
        sizes |= {chips * per_chip for chips in topologies}
    return sorted(sizes)


@cache
def _priced_sizes() -> dict[str, tuple[int, ...]]:
    """Each family's slice sizes in the shipped price table (data/tpu_prices.json, which price_table reads for
    the prices: read here too, since that module parses types with this one)."""
    raw = json.loads(resources.files("tpuops.cloud").joinpath("data/tpu_prices.json").read_text())
    return {fam: tuple(int(s) for s in entry["slices"]) for fam, entry in raw["families"].items()}


def _sizes_words(sizes: list[int]) -> str:
    shown = ", ".join(map(str, sizes[:10]))
    return shown + (f", ... ({len(sizes)} sizes up to {sizes[-1]})" if len(sizes) > 10 else "")


def parse(accelerator_type: str) -> AcceleratorType:
    """The one parse of an accelerator type: a known family and one of its known sizes (`known_sizes`), else a
    UsageError (exit 2) naming the families or that family's sizes, with a close match when there is one."""
    import difflib

    family, _, size = accelerator_type.strip().rpartition("-")
    if family not in FAMILIES or not size.isdigit():
        close = difflib.get_close_matches(family or accelerator_type, list(FAMILIES), n=1, cutoff=0.5)
        mean = f"did you mean {close[0]}-{size if size.isdigit() else 8}? " if close else ""
        raise UsageError(
            f"unknown accelerator type {accelerator_type!r}",
            hint=f"{mean}expected FAMILY-SIZE with FAMILY one of {', '.join(FAMILIES)}, e.g. v6e-8 or v4-16",
        )
    sizes = known_sizes(family)
    if int(size) not in sizes:
        near = min(sizes, key=lambda n: (abs(n - int(size)), n))
        raise UsageError(
            f"unknown accelerator type {accelerator_type!r}: {family} has no slice of {size} {FAMILIES[family].unit}",
            hint=f"did you mean {family}-{near}? {family} sizes: {_sizes_words(sizes)}",
        )
    return AcceleratorType(family, int(size))


def worker_count(accelerator_type: str) -> int:
    """Number of hosts (TPU-VM workers) of a slice; UsageError naming the valid forms otherwise."""
    return parse(accelerator_type).hosts


# Compute Engine TPU machine types per family (chips per VM in the name: -4t = 4 chips), from Google's
# "TPU resources in Compute Engine" pages and xpk's system_characteristics.py. Multi-host slices use the 4-chip
# type; a single host up to 8 chips (v5e/v6e) uses the type with that many.
MACHINE_PREFIX = {"v5p": "ct5p-hightpu", "v5litepod": "ct5lp-hightpu", "v5e": "ct5lp-hightpu",
                  "v6e": "ct6e-standard", "tpu7x": "tpu7x-standard"}  # fmt: skip
_FAMILY_OF_MACHINE = {"ct5p-hightpu": "v5p", "ct5lp-hightpu": "v5litepod", "ct6e-standard": "v6e",
                      "tpu7x-standard": "tpu7x"}  # fmt: skip
_MACHINE = re.compile(r"^(?P<prefix>[a-z0-9]+-[a-z]+)-(?P<chips>\d+)t$")
THREE_D = ("v4", "v5p", "tpu7x")  # 3D tori; the others are 2D
# Google's topology names (2D: v5e/v6e; 3D: v4/v5p/TPU7x), by chip count.
_TOPOLOGY_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
                512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}  # fmt: skip
_TOPOLOGY_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}


@dataclass(frozen=True)
class Shape:
    """One slice on Compute Engine: the machine type of each VM, the accelerator topology, and the VM count."""

    accelerator_type: str
    machine_type: str
    topology: str
    vms: int


def _chips(family: str, size: int) -> int:
    return size // 2 if FAMILIES[family].unit == "cores" else size


def _topology(family: str, chips: int) -> str:
    if family not in THREE_D:
        if chips not in _TOPOLOGY_2D:
            raise UsageError(f"no 2D topology known for {chips} chips (known: {sorted(_TOPOLOGY_2D)})")
        return _TOPOLOGY_2D[chips]
    if chips not in _TOPOLOGY_3D:
        raise UsageError(f"no 3D topology known for {chips} chips (known: {sorted(_TOPOLOGY_3D)})")
    return _TOPOLOGY_3D[chips]


def compute_shape(accelerator_type: str) -> Shape:
    """`tpu7x-16` -> Shape(tpu7x-standard-4t, 2x2x2, 2 VMs): what `vm create --api compute` asks for."""
    acc = parse(accelerator_type)  # the same errors as the TPU API path
    family, size = acc.family, acc.size
    if family not in MACHINE_PREFIX:
        raise UsageError(
            f"{accelerator_type} has no Compute Engine machine type",
            hint=f"Compute Engine TPU VMs are {', '.join(sorted(set(MACHINE_PREFIX) - {'v5e'}))}; "
            "use the Cloud TPU API for the others (drop --api compute)",
        )
    chips = _chips(family, size)
    vms = acc.hosts
    per_vm = chips if vms == 1 else chips // vms
    return Shape(accelerator_type, f"{MACHINE_PREFIX[family]}-{per_vm}t", _topology(family, chips), vms)


def accelerator_of(machine_type: str, topology: str = "") -> str:
    """`ct6e-standard-4t` (+ `4x4` of a MIG's workload policy) -> `v6e-16`: the fit preflight's accelerator type.
    Without a topology the slice is the one VM. Unknown machine types give ''."""
    m = _MACHINE.match(machine_type.rsplit("/", 1)[-1])
    family = _FAMILY_OF_MACHINE.get(m["prefix"], "") if m else ""
    if not m or not family:
        return ""
    chips = int(m["chips"])
    if topology:
        chips = 1
        for d in topology.split("x"):
            chips *= int(d)
    return f"{family}-{chips * 2 if FAMILIES[family].unit == 'cores' else chips}"


def topology_of(machine_type: str) -> str:
    """The topology of one VM of this machine type (a single-host slice)."""
    acc = accelerator_of(machine_type)
    if not acc:
        return ""
    family, size = acc.rsplit("-", 1)
    return _topology(family, _chips(family, int(size)))


def slice_of(machine_type: str, vms: int) -> tuple[str, str]:
    """(accelerator type, topology) of `vms` VMs of one machine type forming one slice: `tpu7x-standard-4t` x 2
    -> (`tpu7x-16`, `2x2x2`); ("", "") for a machine type that is not a TPU's."""
    per_vm = accelerator_of(machine_type)
    if not per_vm:
        return "", ""
    family, size = per_vm.rsplit("-", 1)
    acc = f"{family}-{int(size) * max(vms, 1)}"
    try:
        return acc, compute_shape(acc).topology
    except UsageError:
        return acc, ""


def family(accelerator_type: str) -> str:
    """The family of a type as prices name it: `v5litepod-8` -> `v5e`, `v6e-8` -> `v6e`."""
    return parse(accelerator_type).price_family


def chips(accelerator_type: str) -> int:
    """Chips of a slice (what TPU prices count): TensorCore-named families have 2 cores per chip."""
    return parse(accelerator_type).chips
