"""Compile each program of a step for the target and judge it: per-device memory against HBM, and a roofline
lower bound of its time.

Per phase: peak = arguments + outputs - donated (aliased) + temporaries + what stays resident beside it.
It fits when peak <= (1 - HEADROOM) x HBM per device. Time per run = max(flops / peak FLOP/s, HBM bytes /
HBM bandwidth) + bytes moved by collectives / ICI bandwidth (100% of the roofline: a lower bound, not a
promise), times the phase's multiplier; a step is the sum over its phases.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

from trainer.fit import hlo
from trainer.fit.programs import Program

HEADROOM = 0.10


def _cost(compiled: Any) -> dict[str, float]:
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older jax: one dict per computation
        cost = cost[0] if cost else {}
    return {"flops": float(cost.get("flops", 0.0)), "bytes_accessed": float(cost.get("bytes accessed", 0.0))}


def phase(program: Program, devices: int, per_device: dict[str, float]) -> dict[str, Any]:
    """Compile one program and measure it (bytes are per device)."""
    t0 = time.perf_counter()
    try:
        compiled = program.lowered.compile()
    except Exception as e:  # libtpu refuses a program whose temporaries exceed HBM: that is a verdict
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return _too_big(program, str(e), time.perf_counter() - t0, per_device)
    compile_s = time.perf_counter() - t0
    print(f"fit: compiled {program.name} in {compile_s:.1f} s", file=sys.stderr, flush=True)
    mem = compiled.memory_analysis()
    arg, out, alias, temp = (int(getattr(mem, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp"))
    peak = arg + out - alias + temp + program.resident_bytes
    cost = _cost(compiled)
    coll = hlo.collectives(compiled.as_text(), devices)
    terms = {
        "compute": cost["flops"] / per_device["flops"],
        "hbm": cost["bytes_accessed"] / per_device["hbm_bw"],
        "collectives": coll["moved"] / per_device["ici_bw"],
    }
    once = max(terms["compute"], terms["hbm"]) + terms["collectives"]
    usable = (1 - HEADROOM) * per_device["hbm_bytes"]
    return {
        "argument_bytes": arg, "output_bytes": out, "alias_bytes": alias, "temp_bytes": temp,
        "resident_bytes": program.resident_bytes, "peak_bytes": peak, "fits": peak <= usable,
        "headroom": 1 - peak / per_device["hbm_bytes"], "flops": cost["flops"],
        "bytes_accessed": cost["bytes_accessed"], "collective_bytes": coll, "compile_s": round(compile_s, 2),
        "runs_per_step": program.multiplier if program.in_step else 0,
        "seconds": once * program.multiplier if program.in_step else 0.0,
        "largest_term": max(terms, key=terms.get), "terms_s": terms,
    }  # fmt: skip


_TEMP = re.compile(r"HLO temporaries \(([0-9.]+)([KMGT])\)")


def _too_big(program: Program, message: str, compile_s: float, per_device: dict[str, float]) -> dict[str, Any]:
    """The phase record of a program libtpu would not compile: its temporaries alone exceed HBM."""
    m = _TEMP.search(message)
    temp = int(float(m[1]) * 1024 ** " KMGT".index(m[2])) if m else int(per_device["hbm_bytes"])
    peak = temp + program.resident_bytes
    print(f"fit: {program.name} does not fit: {message.splitlines()[0][:200]}", file=sys.stderr, flush=True)
    return {
        "argument_bytes": 0, "output_bytes": 0, "alias_bytes": 0, "temp_bytes": temp,
        "resident_bytes": program.resident_bytes, "peak_bytes": peak, "fits": False,
        "headroom": 1 - peak / per_device["hbm_bytes"], "flops": 0.0, "bytes_accessed": 0.0,
        "collective_bytes": {"moved": 0}, "compile_s": round(compile_s, 2), "runs_per_step": 0, "seconds": 0.0,
        "largest_term": "-", "terms_s": {}, "error": message.splitlines()[0][:300],
    }  # fmt: skip


def judge(programs: list[Program], devices: int, per_device: dict[str, float]) -> dict[str, Any]:
    """Every phase measured, the verdict and the step estimate."""
    phases = {p.name: phase(p, devices, per_device) for p in programs}
    fits = all(p["fits"] for p in phases.values())
    worst = min(phases, key=lambda k: phases[k]["headroom"])
    seconds = sum(p["seconds"] for p in phases.values())
    return {
        "phases": phases, "fits": fits, "headroom": phases[worst]["headroom"], "tightest_phase": worst,
        "estimate": {
            "step_s": seconds,
            "phases_s": {k: p["seconds"] for k, p in phases.items() if p["runs_per_step"]},
            "largest_phase": max(phases, key=lambda k: phases[k]["seconds"]),
        },
    }  # fmt: skip
