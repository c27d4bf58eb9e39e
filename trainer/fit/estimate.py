"""What a step will take: a bound op by op (roofline per op, collectives over the ICI links they really use, a
latency per hop) and an expected range from documented efficiencies.

Bound, per phase (one execution of its program; trainer.fit.hlo counts each loop body its trip count):
- every top-level op that is not a collective: max(its matmul FLOPs / peak FLOP/s, its HBM bytes / HBM
  bandwidth) (trainer.fit.flops.op_flops, trainer.fit.traffic.op_bytes), summed: ops run one after another on
  a TensorCore, so a program's time is at least the sum of its ops' rooflines, not the max over the program.
- every collective: the bytes each device sends / (one-way link bandwidth x the links its group can use) + its
  hops x the latency of one hop. A group spans the torus dimensions its devices' coordinates vary in; per
  dimension it uses one link (a line: no wraparound below a full pod axis) or two (a ring with wraparound), and
  needs extent - 1 hops (a line) or extent // 2 (a ring) to reach every member; an all-reduce (reduce-scatter
  then all-gather) twice that. The ICI figures and their sources are in trainer.fit.tpus.
Collectives are added to the ops, not overlapped with them (the decode's per-layer all-reduces sit on its
critical path); at 100% of every peak this is the figure no implementation of the same program can beat.

Expected range: the ops' roofline divided by the efficiency a published implementation of the same kind of
program reaches (EFFICIENCY, by phase kind, with its source), collective bandwidth at the efficiency measured in
the same source, latency between 1x and the measured multiple of the nominal per-hop figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.fit import flops, hlo, traffic


@dataclass(frozen=True)
class Efficiency:
    low: float  # fraction of the roofline reached at worst
    high: float  # at best
    source: str


# Documented efficiencies by phase kind (the figure an implementation reached / its roofline).
EFFICIENCY: dict[str, Efficiency] = {
    # Decode loops are HBM-bound: published TPU decode reaches about half to two thirds of HBM bandwidth.
    "decode": Efficiency(
        0.50, 0.68, "JetStream decode on v5e-8, 50-68% of HBM bandwidth (as surveyed in issue 28)"
    ),
    # Training-like programs (the prefill's forward, the update): the planning MFU of the jax-ml scaling book.
    "train": Efficiency(
        0.40,
        0.50,
        "jax-ml scaling book: 40% MFU (applied-training, applied-inference) to 50% (training) for TPU training",
    ),
}
PHASE_KIND = {
    "decode_cast": "decode",
    "decode": "decode",
    "prefill": "train",
    "ref_logp": "train",
    "update": "train",
}
# jax-ml scaling book, "Sharded matrices" (sharding.md): an AllGather profiled at 680 us against 560 us in theory
# (82% of ICI bandwidth), and a 3-hop latency-bound one at ~8 us against 3 x 1 us.
ICI_EFFICIENCY = 560 / 680
LATENCY_MEASURED_X = 8 / 3


@dataclass(frozen=True)
class Geometry:
    """Where each device (partition id = position in the program's device list) sits on the ICI torus."""

    coords: tuple[tuple[int, ...], ...]  # per device: its chip's torus coordinates
    wrap_from: int  # a dimension this long or longer has wraparound links (trainer.fit.tpus.Chip.wrap_from)

    @property
    def extents(self) -> tuple[int, ...]:
        return tuple(max(c[d] for c in self.coords) + 1 for d in range(len(self.coords[0])))

    def links_and_hops(self, group: tuple[int, ...]) -> tuple[int, int]:
        """(links a device of `group` sends over at once, hops to reach every member) for a ring collective."""
        links = hops = 0
        for d, full in enumerate(self.extents):
            seen = {self.coords[i][d] for i in group if i < len(self.coords)}
            extent = max(seen) - min(seen) + 1 if seen else 1
            if extent == 1:
                continue
            ring = extent == full and full >= self.wrap_from
            links += 2 if ring else 1
            hops += extent // 2 if ring else extent - 1
        return max(links, 1), hops


def line(devices: int) -> Geometry:
    """No coordinates known: the devices on one line (one link each way, no wraparound)."""
    return Geometry(tuple((i,) for i in range(devices)), wrap_from=1 << 30)


def collective_seconds(op: hlo.CollectiveOp, rates: dict[str, float], geo: Geometry) -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of one run of a collective."""
    links, hops = geo.links_and_hops(op.group)
    if op.kind == "all-reduce":
        hops *= 2
    elif op.kind == "collective-permute":
        hops = min(hops, 1)
    return op.moved_bytes / (rates["link_bw"] * links), hops * rates["hop_latency_s"]


def phase_costs(module: hlo.Module, rates: dict[str, float], geo: Geometry) -> dict[str, Any]:
    """The bound's terms for one execution of a compiled program (see the module docstring)."""
    by_op = flops.op_flops(module)
    collective_names = {c.name for c in hlo.collective_ops(module, len(geo.coords))}
    compute = hbm = roofline = 0.0
    for r in traffic.op_bytes(module):
        if r.name in collective_names:
            continue
        c, m = by_op.get(r.name, 0) * r.count / rates["flops"], r.bytes / rates["hbm_bw"]
        compute, hbm, roofline = compute + c, hbm + m, roofline + max(c, m)
    bw = latency = 0.0
    count = 0
    for op in hlo.collective_ops(module, len(geo.coords)):
        b, lat = collective_seconds(op, rates, geo)
        bw, latency, count = bw + op.runs * b, latency + op.runs * lat, count + op.runs
    return {
        "compute_s": compute, "hbm_s": hbm, "roofline_s": roofline, "collective_bw_s": bw,
        "collective_latency_s": latency, "collectives": count, "bound_s": roofline + bw + latency,
    }  # fmt: skip


def expected(phase: str, costs: dict[str, Any]) -> tuple[float, float]:
    """(low, high) seconds of one execution: the roofline at the best and worst documented efficiency."""
    eff = EFFICIENCY[PHASE_KIND.get(phase, "train")]
    ici = costs["collective_bw_s"] / ICI_EFFICIENCY
    lat = costs["collective_latency_s"]
    return (
        costs["roofline_s"] / eff.high + ici + lat,
        costs["roofline_s"] / eff.low + ici + lat * LATENCY_MEASURED_X,
    )
