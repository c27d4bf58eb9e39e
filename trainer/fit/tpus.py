"""TPU accelerator types -> topology and per-device HBM, peak bf16 FLOP/s, HBM and ICI bandwidth (one table).

Figures per chip from Google's Cloud TPU system-architecture pages (docs/performance.md cites them):
v4 275 TFLOP/s, 32 GiB at 1200 GB/s; v5e 197 TFLOP/s, 16 GiB at 819 GB/s, ICI 400 GB/s; v5p 459 TFLOP/s,
95 GiB at 2765 GB/s, ICI 1200 GB/s; v6e 918 TFLOP/s, 32 GiB at 1638 GB/s, ICI 800 GB/s (ICI bidirectional
per chip; v4's page gives none: 1.1 PB/s all-reduce per 4096-chip pod = ~270 GB/s per chip one way).
Collectives are costed at half the bidirectional ICI bandwidth (one direction), per chip, split over its ICI ports
(v5e and v6e 4 ports, 2D torus; v4 and v5p 6, 3D): one link one way is v6e 100 GB/s, v5e 50, v5p 100, v4 45, the
jax-ml scaling book's per-link figures (tpus.md). A slice axis has wraparound links only on a full pod axis for
v5e/v6e (16 chips) and from 4 chips on v4/v5p (scaling book, tpus.md; Cloud TPU v5p: "4x4x4 and larger slices have
full 3D torus"). Each hop over a link costs about 1 us whatever the size, "typically around 1us" (jax-ml scaling
book, "Sharded matrices", sharding.md: "A note on ICI latency"): the latency term of trainer.fit.estimate.
TPU7x (Ironwood) from https://docs.cloud.google.com/tpu/docs/tpu7x: 2307 TFLOP/s bf16, 192 GiB HBM; HBM 7.37 TB/s and
ICI 1.2 TB/s bidirectional per chip are Google's launch figures (jax's `jax/_src/tpu_info.py` has 7.40e12 B/s); its
3D torus is costed as v5p's (6 ports, wraparound from 4 chips: not confirmed for TPU7x).
v4, v5p and TPU7x name TensorCores (v4-8 = 4 chips; tpu7x-8 = 4 chips, topology 2x2x1, as xpk and GKE name it);
v5e and v6e name chips. JAX's v4 topologies show one device per
TensorCore, v5p's one per chip (megacore): per-device figures divide the chip's by its devices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1 << 30
# Multislice: slices talk over the data-center network. "DCN bandwidth is typically around 2.5e10 bytes / second
# per host" (jax-ml scaling book, "How to Think About TPUs", tpus.md, commit 04d8de5). One figure for every
# generation: Google's docs give no per-host DCN figure per TPU type (v5e's page gives 6.4 Tbps per 256-chip pod).
DCN_BYTES_PER_S_PER_HOST = 2.5e10


@dataclass(frozen=True)
class Chip:
    family: str  # the topology prefix JAX knows (v4, v5e, v5p, v6e)
    names: str  # what the number in the accelerator type counts: "cores" or "chips"
    hbm_bytes: int
    bf16_flops: float
    hbm_bw: float  # bytes/s
    ici_bw: float  # bytes/s, one direction, per chip
    ports: int = 4  # ICI links per chip (one per torus direction)
    wrap_from: int = 16  # an axis of the slice this long or longer has wraparound links
    hop_latency_s: float = 1e-6  # per ICI hop, whatever the size


CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", "cores", 32 * GIB, 275e12, 1200e9, 270e9, ports=6, wrap_from=4),
    "v5e": Chip("v5e", "chips", 16 * GIB, 197e12, 819e9, 200e9),
    "v5p": Chip("v5p", "cores", 95 * GIB, 459e12, 2765e9, 600e9, ports=6, wrap_from=4),
    "v6e": Chip("v6e", "chips", 32 * GIB, 918e12, 1638e9, 400e9),
    "tpu7x": Chip("tpu7x", "cores", 192 * GIB, 2307e12, 7370e9, 600e9, ports=6, wrap_from=4),
}
ALIASES = {"v5litepod": "v5e"}

# Chips -> JAX topology name (2D tori for v5e/v6e, 3D for v4/v5p).
TOPOLOGY_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
TOPOLOGY_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8"}
THREE_D = ("v4", "v5p", "tpu7x")

_TYPE = re.compile(r"^(?P<family>v4|v5e|v5litepod|v5p|v6e|tpu7x)-(?P<size>\d+)$")
_TOPO = re.compile(r"^(?P<family>v4|v5e|v5p|v6e|tpu7x):(?P<shape>\d+(x\d+)+)$")


class UnknownAcceleratorError(ValueError):
    """An accelerator type or topology this table cannot map."""


@dataclass(frozen=True)
class Target:
    """What a compile is for: the accelerator, its JAX topology and the per-chip figures."""

    accelerator: str
    topology: str
    chip: Chip
    chips: int

    def per_device(self, devices: int) -> dict[str, float]:
        """HBM bytes, FLOP/s and bandwidths of one JAX device when the slice shows `devices` of them."""
        share = self.chips / devices
        c = self.chip
        return {
            "hbm_bytes": c.hbm_bytes * share, "flops": c.bf16_flops * share,
            "hbm_bw": c.hbm_bw * share, "ici_bw": c.ici_bw * share,
            "link_bw": c.ici_bw / c.ports * share, "hop_latency_s": c.hop_latency_s,
        }  # fmt: skip


def from_accelerator(accelerator: str) -> Target:
    """`v6e-8` -> Target(topology `v6e:2x4`, 8 chips); an unknown type is an error naming the known forms."""
    m = _TYPE.match(accelerator.strip().lower())
    if not m:
        raise UnknownAcceleratorError(
            f"unknown accelerator type {accelerator!r}: expected v4-N, v5e-N (v5litepod-N), v5p-N, v6e-N or "
            "tpu7x-N, e.g. v6e-8 or tpu7x-8"
        )
    chip = CHIPS[ALIASES.get(m["family"], m["family"])]
    size = int(m["size"])
    chips = size // 2 if chip.names == "cores" else size
    table = TOPOLOGY_3D if chip.family in THREE_D else TOPOLOGY_2D
    if chips not in table:
        raise UnknownAcceleratorError(
            f"accelerator {accelerator!r}: no topology known for {chips} chips (known: {sorted(table)} chips); "
            "pass --topology FAMILY:AxB[xC]"
        )
    return Target(accelerator, f"{chip.family}:{table[chips]}", chip, chips)


def from_topology(topology: str) -> Target:
    """`v6e:2x4` -> Target (accelerator `v6e-8`)."""
    m = _TOPO.match(topology.strip().lower())
    if not m:
        raise UnknownAcceleratorError(
            f"unknown topology {topology!r}: expected FAMILY:AxB[xC], e.g. v6e:2x4, v4:2x2x1 or tpu7x:2x2x1"
        )
    chip = CHIPS[m["family"]]
    chips = 1
    for d in m["shape"].split("x"):
        chips *= int(d)
    size = chips * 2 if chip.names == "cores" else chips
    return Target(f"{chip.family}-{size}", topology.strip().lower(), chip, chips)
