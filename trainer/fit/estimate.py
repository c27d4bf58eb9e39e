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
Overlap as compiled: each computation's ops run in the order of the compiled schedule (the text order of a
scheduled module). A collective libtpu left synchronous (an `all-reduce`, an `all-gather`: libtpu turns an async
pair with nothing scheduled between its start and done back into one op) holds the TensorCore for its time;
an async pair (`collective-permute-start` ... `-done`: the windowed einsum's pieces; or a `call-start` ...
`call-done` whose called computation holds the collective: TPU7x runs its all-reduces on the SparseCore this
way) runs while the ops scheduled between them run, and its done waits only for what is left. A collective held
inside a fusion holds the TensorCore like a synchronous one. Collectives of one computation use the links one
after another. At 100% of every peak this is the figure no implementation of the same program
can beat; `overlap_s` is the collective time the schedule hides behind ops.

Expected range: the same schedule with each op's roofline divided by the efficiency a published
implementation of the same kind of program reaches (EFFICIENCY, by phase kind, with its source), collective
bandwidth at the efficiency measured in the same source, latency between 1x and the measured multiple of the
nominal per-hop figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

from trainer.fit import flops, hlo, traffic


@dataclass(frozen=True)
class Efficiency:
    low: float  # fraction of the roofline reached at worst
    high: float  # at best
    source: str


# Documented efficiencies by phase kind (the figure an implementation reached / its roofline).
EFFICIENCY: dict[str, Efficiency] = {
    # Decode loops are HBM-bound: published TPU decode reaches about half to two thirds of HBM bandwidth.
    "decode": Efficiency(0.50, 0.68, "JetStream decode on v5e-8, 50-68% of HBM bandwidth"),
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


def _op_seconds(r: traffic.OpBytes, by_op: dict[str, int], rates: dict[str, float]) -> tuple[float, float]:
    """One run of an op at peak: (its matmul FLOPs / peak FLOP/s, its HBM bytes / HBM bandwidth)."""
    return by_op.get(r.name, 0) / rates["flops"], (r.operand_bytes + r.result_bytes) / rates["hbm_bw"]


class Timeline(NamedTuple):
    """One top-level computation's schedule: its runs per execution and its events in order, each ("op",
    roofline_s, 0, ""), ("sync", bandwidth_s, latency_s, ""), ("start", bandwidth_s, latency_s, name) or
    ("done", 0, 0, name of its start)."""

    runs: int
    events: list[tuple[str, float, float, str]]


def timelines(
    module: hlo.Module,
    rates: dict[str, float],
    geo: Geometry,
    by_op: dict[str, int],
    rows: list[traffic.OpBytes],
    collectives: list[hlo.CollectiveOp],
) -> list[Timeline]:
    """Every top-level computation's schedule (see the module docstring), from the program's matmul FLOPs per
    op (trainer.fit.flops.op_flops), HBM bytes per op (trainer.fit.traffic.op_bytes) and collectives."""
    by_name = {r.name: r for r in rows}
    colls = {c.name: c for c in collectives}

    def held_by(ins: hlo.Instruction) -> list[hlo.CollectiveOp]:
        """The op's own collective, or those held inside the computations it calls (libtpu's TPU7x programs wrap
        each all-reduce in an async `call-start` ... `call-done`; a fusion may hold one): where it sits, they run."""
        own = [colls[ins.name]] if ins.name in colls else []
        return own + [c for _, n in hlo.callees(ins.line) if n in module.nested for c in inside(n)]

    @cache
    def inside(computation: str) -> list[hlo.CollectiveOp]:
        return [c for i in module.computations.get(computation, []) for c in held_by(i)]

    out = []
    for name, body in module.computations.items():
        if name in module.nested:
            continue
        events: list[tuple[str, float, float, str]] = []
        started: set[str] = set()
        for ins in body:
            if mine := held_by(ins):
                times = [collective_seconds(c, rates, geo) for c in mine]
                is_start = ins.op.endswith("-start")
                events.append(("start" if is_start else "sync", sum(t[0] for t in times), sum(t[1] for t in times),
                               ins.name))  # fmt: skip
                started |= {ins.name} if is_start else set()
                if ins.name in colls:
                    continue
            if ins.op.endswith("-done") and (ops := hlo.operands(ins)) and ops[0] in started:
                events.append(("done", 0.0, 0.0, ops[0]))
            if (r := by_name.get(ins.name)) is not None:  # (a done's result bytes count as before)
                events.append(("op", max(_op_seconds(r, by_op, rates)), 0.0, ""))
        out.append(Timeline(module.counts[name], events))
    return out


def simulate(
    lines: list[Timeline], op_scale: float = 1.0, bw_scale: float = 1.0, latency_scale: float = 1.0
) -> float:
    """Seconds of one execution: each computation's schedule run through (ops one after another on the
    TensorCore, collectives one after another on the links, an async collective beside the ops between its
    start and its done), times its runs; each op's and collective's time scaled as given."""
    total = 0.0
    for runs, events in lines:
        core = link = 0.0
        pending: dict[str, float] = {}
        for kind, a, b, name in events:
            if kind == "op":
                core += a * op_scale
            elif kind == "done":
                core = max(core, pending.pop(name, core))
            else:
                end = max(core, link) + a * bw_scale + b * latency_scale
                link = end
                if kind == "sync":
                    core = end
                else:
                    pending[name] = end
        total += runs * max(core, *pending.values()) if pending else runs * core
    return total


def phase_costs(
    module: hlo.Module, rates: dict[str, float], geo: Geometry, phase: str = "update"
) -> dict[str, Any]:
    """The bound's terms for one execution of a compiled program, and its expected range as `phase`'s kind
    (see the module docstring)."""
    by_op, rows = flops.op_flops(module), traffic.op_bytes(module)
    collectives = hlo.collective_ops(module, len(geo.coords))
    lines = timelines(module, rates, geo, by_op, rows, collectives)
    collective_names = {c.name for c in collectives}
    compute = hbm = roofline = 0.0
    for r in rows:
        if r.name in collective_names:
            continue
        c, m = (r.count * t for t in _op_seconds(r, by_op, rates))
        compute, hbm, roofline = compute + c, hbm + m, roofline + max(c, m)
    bw = latency = 0.0
    count = 0
    for op in collectives:
        b, lat = collective_seconds(op, rates, geo)
        bw, latency, count = bw + op.runs * b, latency + op.runs * lat, count + op.runs
    bound = simulate(lines)
    eff = EFFICIENCY[PHASE_KIND.get(phase, "train")]
    expected = [simulate(lines, 1 / eff.high, 1 / ICI_EFFICIENCY), simulate(lines, 1 / eff.low, 1 / ICI_EFFICIENCY,
                LATENCY_MEASURED_X)]  # fmt: skip
    return {
        "compute_s": compute, "hbm_s": hbm, "roofline_s": roofline, "collective_bw_s": bw,
        "collective_latency_s": latency, "collectives": count,
        "overlap_s": max(roofline + bw + latency - bound, 0.0), "bound_s": bound, "expected_s": expected,
    }  # fmt: skip
