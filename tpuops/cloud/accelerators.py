"""Accelerator types (v4-8, v6e-16, ...) -> how many TPU-VM hosts (workers) a slice has."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpuops.errors import UsageError

_TYPE = re.compile(r"^(?P<family>v2|v3|v4|v5p|v5litepod|v5e|v6e|tpu7x)-(?P<size>\d+)$")


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
    "tpu7x": Family("chips", 4, 8),
}

# Worked examples of the rule above, checked by the tests against worker_count().
KNOWN_HOSTS: dict[str, int] = {
    "v2-8": 1, "v3-8": 1, "v3-32": 4,
    "v4-8": 1, "v4-16": 2, "v4-32": 4, "v4-64": 8,
    "v5p-8": 1, "v5p-16": 2,
    "v5litepod-1": 1, "v5litepod-4": 1, "v5litepod-8": 1, "v5litepod-16": 4, "v5litepod-256": 64,
    "v6e-1": 1, "v6e-4": 1, "v6e-8": 1, "v6e-16": 4, "v6e-32": 8, "v6e-256": 64,
}  # fmt: skip


def worker_count(accelerator_type: str) -> int:
    """Number of hosts (TPU-VM workers) of a slice; UsageError naming the valid forms otherwise."""
    m = _TYPE.match(accelerator_type)
    if not m:
        raise UsageError(
            f"unknown accelerator type {accelerator_type!r}",
            hint=f"expected FAMILY-SIZE with FAMILY one of {', '.join(FAMILIES)}, e.g. v6e-8 or v4-16",
        )
    fam, size = FAMILIES[m["family"]], int(m["size"])
    if size <= fam.single_host_max:
        return 1
    if size % fam.per_host:
        raise UsageError(
            f"accelerator type {accelerator_type!r}: {size} {fam.unit} is not a whole number of hosts"
        )
    return size // fam.per_host
