"""Compile each program of a step for the target and judge it: per-device memory against HBM, and a roofline
lower bound of its time.

Per phase: peak = arguments + outputs - donated (aliased) + temporaries + what stays resident beside it.
It fits when peak <= (1 - HEADROOM) x HBM per device. Time per run = max(flops / peak FLOP/s, HBM bytes /
HBM bandwidth) + bytes moved by collectives / ICI bandwidth (100% of the roofline: a lower bound, not a
promise), times the phase's runs per step; a step is the sum over its phases. FLOPs (trainer.fit.flops:
matmuls) and HBM bytes (trainer.fit.traffic: operands and results in HBM, op by op) are read off the compiled
program's text, each loop body times its trip count (trainer.fit.hlo). XLA's own cost analysis, reported
beside them as `xla_flops` and `bytes_accessed`, counts a loop body once (and on TPU `bytes accessed` also
counts VMEM copies).
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

from trainer.fit import flops, hlo, traffic
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


def measure(program: Program, devices: int, breakdown: int = 0) -> dict[str, Any]:
    """Compile one program: its per-device sizes, cost, HBM traffic and collectives (raw figures, no verdict);
    with `breakdown`, its HBM bytes by the `breakdown` largest sources (trainer.fit.traffic.by_source)."""
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
                "collective_bytes": dict.fromkeys((*hlo.KINDS, "moved"), 0),
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
    return {**raw, "flops": float(flops.flops(module)), **_xla_cost(compiled),
            "collective_bytes": hlo.collectives(module, devices), "compile_s": compile_s}  # fmt: skip


def verdict(raw: dict[str, Any], per_device: dict[str, float]) -> dict[str, Any]:
    """Peak, fit, headroom and the roofline time of one measured phase."""
    peak = (raw["argument_bytes"] + raw["output_bytes"] - raw["alias_bytes"] + raw["temp_bytes"]
            + raw["resident_bytes"])  # fmt: skip
    terms = {
        "compute": raw["flops"] / per_device["flops"],
        "hbm": raw["hbm_bytes"] / per_device["hbm_bw"],
        "collectives": raw["collective_bytes"]["moved"] / per_device["ici_bw"],
    }
    once = max(terms["compute"], terms["hbm"]) + terms["collectives"]
    fits = "error" not in raw and peak <= (1 - HEADROOM) * per_device["hbm_bytes"]
    return {**raw, "peak_bytes": peak, "fits": fits, "headroom": 1 - peak / per_device["hbm_bytes"],
            "seconds": once, "terms_s": terms,
            "largest_term": max(terms, key=lambda k: terms[k])}  # fmt: skip


def judge(phases_raw: dict[str, dict[str, Any]], per_device: dict[str, float]) -> dict[str, Any]:
    """Every phase judged, the overall verdict and the step estimate."""
    phases = {k: verdict(v, per_device) for k, v in phases_raw.items()}
    worst = min(phases, key=lambda k: phases[k]["headroom"])
    return {
        "phases": phases, "fits": all(p["fits"] for p in phases.values()), "headroom": phases[worst]["headroom"],
        "tightest_phase": worst,
        "estimate": {
            "step_s": sum(p["seconds"] for p in phases.values()),
            "phases_s": {k: p["seconds"] for k, p in phases.items()},
            "largest_phase": max(phases, key=lambda k: phases[k]["seconds"]),
        },
    }  # fmt: skip


def measure_all(programs: list[Program], devices: int, breakdown: int = 0) -> dict[str, dict[str, Any]]:
    return {p.name: measure(p, devices, breakdown) for p in programs}
