"""Compile each program of a step for the target and judge it: per-device memory against HBM, and what its time
will be (trainer.fit.estimate: a bound op by op and an expected range).

Per phase: peak = arguments + outputs - donated (aliased) + temporaries + what stays resident beside it.
It fits when peak <= (1 - HEADROOM) x HBM per device. Time: the bound of trainer.fit.estimate (each op's
roofline, each collective over the links it uses plus a latency per hop), and the expected range from documented
efficiencies; the step adds the host's work (trainer.fit.host). The former per-program figure, max(flops / peak
FLOP/s, HBM bytes / HBM bandwidth) + collective bytes / the chip's one-way ICI bandwidth, stays in the result as
`program_roofline_s`. FLOPs (trainer.fit.flops: matmuls) and HBM bytes (trainer.fit.traffic: operands and
results in HBM, op by op) are read off the compiled program's text, each loop body times its trip count
(trainer.fit.hlo). XLA's own cost analysis, reported beside them as `xla_flops` and `bytes_accessed`, counts a
loop body once (and on TPU `bytes accessed` also counts VMEM copies).
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

from trainer.fit import dcn, estimate, flops, hlo, traffic
from trainer.fit.programs import Program

HEADROOM = 0.10
_TEMP = re.compile(r"HLO temporaries \(([0-9.]+)([KMGT])\)")


def _xla_cost(compiled: Any) -> dict[str, float]:
    """XLA's own figures: a loop body counted once, elementwise ops among the flops, VMEM among the bytes."""
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older jax: one dict per computation
        cost = cost[0] if cost else {}
    return {
        "xla_flops": float(cost.get("flops", 0.0)),
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
    }


def measure(
    program: Program,
    devices: int,
    breakdown: int = 0,
    rates: dict[str, float] | None = None,
    geo: estimate.Geometry | None = None,
) -> dict[str, Any]:
    """Compile one program: its per-device sizes, cost, HBM traffic and collectives (raw figures, no verdict);
    with `breakdown`, its HBM bytes by the `breakdown` largest sources (trainer.fit.traffic.by_source); with
    the device's `rates` (trainer.fit.tpus.Target.per_device), the bound's terms (trainer.fit.estimate)."""
    t0 = time.perf_counter()
    raw: dict[str, Any] = {"resident_bytes": program.resident_bytes}
    if program.compiled is None and program.error is None:  # tpuops fit's status line shows what compiles
        print(f"fit: compiling {program.name}", file=sys.stderr, flush=True)
    try:
        if program.error is not None:
            raise RuntimeError(program.error)
        compiled = program.compiled or program.lowered.compile()  # the prefill is compiled once, not twice
    except Exception as e:  # libtpu refuses a program whose temporaries exceed HBM: that is a verdict too
        if "RESOURCE_EXHAUSTED" not in str(e) and program.error is None:
            raise
        m = _TEMP.search(str(e))
        temp = int(float(m[1]) * 1024 ** " KMGT".index(m[2])) if m else 0
        print(
            f"fit: {program.name} does not fit: {str(e).splitlines()[0][:200]}", file=sys.stderr, flush=True
        )
        return {**raw, "argument_bytes": 0, "output_bytes": 0, "alias_bytes": 0, "temp_bytes": temp, "flops": 0.0,
                "xla_flops": 0.0, "bytes_accessed": 0.0, "hbm_bytes": 0,
                "collective_bytes": dict.fromkeys((*hlo.KINDS, "moved"), 0), "costs": None, "dcn_bytes": 0,
                "compile_s": time.perf_counter() - t0, "error": str(e).splitlines()[0][:300]}  # fmt: skip
    compile_s = program.compile_s + time.perf_counter() - t0
    print(f"fit: compiled {program.name} in {compile_s:.1f} s", file=sys.stderr, flush=True)
    mem = compiled.memory_analysis()
    for k in ("argument", "output", "alias", "temp"):
        raw[f"{k}_bytes"] = int(getattr(mem, f"{k}_size_in_bytes"))
    module = hlo.parse(compiled.as_text(), program.loop_trips)
    ops = traffic.op_bytes(module)
    raw["hbm_bytes"] = sum(r.bytes for r in ops)
    if breakdown:
        raw["breakdown"] = traffic.by_source(ops, breakdown)
    if rates is not None:
        raw["costs"] = estimate.phase_costs(module, rates, geo or estimate.line(devices), program.name)
    raw["dcn_bytes"] = dcn.dcn_bytes(module)  # 0 on one slice: nothing leaves it over DCN
    return {**raw, "flops": float(flops.flops(module)), **_xla_cost(compiled),
            "collective_bytes": hlo.collectives(module, devices), "compile_s": compile_s}  # fmt: skip


def verdict(raw: dict[str, Any], per_device: dict[str, float], name: str = "") -> dict[str, Any]:
    """Peak, fit, headroom, the bound and the expected range of one measured phase (`name`: its kind)."""
    peak = (raw["argument_bytes"] + raw["output_bytes"] - raw["alias_bytes"] + raw["temp_bytes"]
            + raw["resident_bytes"])  # fmt: skip
    program = {
        "compute": raw["flops"] / per_device["flops"],
        "hbm": raw["hbm_bytes"] / per_device["hbm_bw"],
        "collectives": raw["collective_bytes"]["moved"] / per_device["ici_bw"],
    }
    program_roofline = max(program["compute"], program["hbm"]) + program["collectives"]
    fits = "error" not in raw and peak <= (1 - HEADROOM) * per_device["hbm_bytes"]
    costs = raw.get("costs")
    if costs:
        terms = {"compute": costs["compute_s"], "hbm": costs["hbm_s"], "collectives": costs["collective_bw_s"],
                 "latency": costs["collective_latency_s"]}  # fmt: skip
        seconds, expected = costs["bound_s"], tuple(costs["expected_s"])
    else:  # nothing compiled (too big), or measured without rates: the per-program figure
        terms, seconds, expected = program, program_roofline, (program_roofline, program_roofline)
    return {**raw, "peak_bytes": peak, "fits": fits, "headroom": 1 - peak / per_device["hbm_bytes"],
            "seconds": seconds, "expected_s": list(expected), "program_roofline_s": program_roofline,
            "terms_s": terms, "largest_term": max(terms, key=lambda k: terms[k])}  # fmt: skip


def judge(
    phases_raw: dict[str, dict[str, Any]], per_device: dict[str, float], host_s: float = 0.0
) -> dict[str, Any]:
    """Every phase judged, the overall verdict and the step estimate: the bound (the phases' bounds and the host's
    measured work) and the expected range (trainer.fit.estimate.EFFICIENCY, each source named)."""
    phases = {k: verdict(v, per_device, k) for k, v in phases_raw.items()}
    worst = min(phases, key=lambda k: phases[k]["headroom"])
    bound = sum(p["seconds"] for p in phases.values()) + host_s
    low = sum(p["expected_s"][0] for p in phases.values()) + host_s
    high = sum(p["expected_s"][1] for p in phases.values()) + host_s
    return {
        "phases": phases, "fits": all(p["fits"] for p in phases.values()), "headroom": phases[worst]["headroom"],
        "tightest_phase": worst,
        "estimate": {
            "step_s": bound, "bound_s": bound, "expected_s": [low, high], "expected_mid_s": (low + high) / 2,
            "host_s": host_s, "phases_s": {k: p["seconds"] for k, p in phases.items()},
            "program_roofline_s": sum(p["program_roofline_s"] for p in phases.values()),
            "largest_phase": max(phases, key=lambda k: phases[k]["seconds"]),
            "efficiency": {k: {"low": e.low, "high": e.high, "source": e.source}
                           for k, e in estimate.EFFICIENCY.items()},
        },
    }  # fmt: skip


def measure_all(
    programs: list[Program],
    devices: int,
    breakdown: int = 0,
    rates: dict[str, float] | None = None,
    geo: estimate.Geometry | None = None,
) -> dict[str, dict[str, Any]]:
    return {p.name: measure(p, devices, breakdown, rates, geo) for p in programs}
