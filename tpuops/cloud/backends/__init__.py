"""The registry of cloud backends: the one place that chooses which implementation of `base.Backend` serves a
VM (by its `kind`) or makes one (by the accelerator type and the API asked for). Adding a backend: one module
beside these and one line in `REGISTRY` (docs/architecture.md, "How to add a cloud backend")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuops.cloud.backends.base import Backend, Listing
from tpuops.cloud.backends.compute_instance import ComputeInstance
from tpuops.cloud.backends.mig_slice import MigSlice
from tpuops.cloud.backends.multislice import Multislice
from tpuops.cloud.backends.tpu_node import TpuNode

if TYPE_CHECKING:
    from tpuops.cloud.tpu_api import VmInfo

# In the order a name is looked for in one zone: the Cloud TPU API first, then Compute Engine.
REGISTRY: dict[str, Backend] = {
    "node": TpuNode(),
    "multislice": Multislice(),
    "instance": ComputeInstance(),
    "mig": MigSlice(),
}

__all__ = ["REGISTRY", "Backend", "Listing", "backend_of", "by_kind", "for_create"]


def by_kind(kind: str) -> Backend:
    return REGISTRY[kind]


def backend_of(vm: VmInfo) -> Backend:
    """The backend that serves `vm`."""
    return REGISTRY[vm.kind]


def for_create(api_name: str, hosts: int, slices: int) -> Backend:
    """The backend that makes a VM through `api_name` ("tpu" or "compute", compute_create.choose_api) of
    `hosts` hosts per slice and `slices` slices."""
    if api_name == "compute":
        return REGISTRY["mig" if hosts > 1 else "instance"]
    return REGISTRY["multislice" if slices > 1 else "node"]
