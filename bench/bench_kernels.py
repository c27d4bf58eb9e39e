"""Loss-kernel benchmark: memory and time of each implementation side by side with the reference, and the
physical floor (bytes that must move over the measured memory bandwidth).

Run: python bench/bench_kernels.py [--rounds 7] [--T-time 1024] [--T-mem 4096] [--json OUT]
Memory: XLA's compiled memory analysis of loss+grad at B=1, T=--T-mem, V=151936, bf16 (compile only).
Time: loss+grad at B=1, T=--T-time, interleaved rounds (reference, chunked, reference, ...), medians.
Pallas runs in interpret mode off TPU, so it is left out of CPU/GPU figures (its interpreter is not a kernel).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from trainer import microbench as mb

V, HIDDEN, DT = 151936, 1536, jnp.bfloat16


def bandwidth_gbs(n_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """Streaming bandwidth of y = 2x + 1 over a float32 array (bytes read + written / median time)."""
    x = jnp.ones((n_bytes // 4,), jnp.float32)
    f = jax.jit(lambda x: x * 2 + 1)
    jax.block_until_ready(f(x))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        ts.append(time.perf_counter() - t0)
    return 2 * n_bytes / statistics.median(ts) / 1e9


def memory(T: int) -> dict[str, dict[str, int]]:
    out = {}
    cases = [("reference", "reference", None), ("chunked", "chunked", None),
             ("reference+lm_head", "reference", HIDDEN), ("fused_lm_head", "fused_lm_head", HIDDEN)]  # fmt: skip
    for name, impl, hidden in cases:
        out[name] = mb.compiled_memory(impl, 1, T, V, DT, hidden)
        print(f"memory T={T} {name:18s} temp={out[name]['temp_bytes'] / 1e9:.3f} GB", flush=True)
    return out


def timing(T: int, rounds: int, impls: tuple[str, ...]) -> dict[str, list[float]]:
    fns = {impl: mb.step_fn(impl, None) for impl in impls}
    args = mb.random_inputs(1, T, V, DT, None)
    for fn in fns.values():
        jax.block_until_ready(fn(*args))  # compile + warm
    ts: dict[str, list[float]] = {impl: [] for impl in impls}
    for r in range(rounds):
        for impl in impls if r % 2 == 0 else impls[::-1]:
            ts[impl] += mb.time_step(fns[impl], args, 1)
    return ts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--T-time", type=int, default=1024)
    ap.add_argument("--T-mem", type=int, default=4096)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    dev = jax.devices()[0]
    res: dict[str, Any] = {
        "device": f"{dev.platform}:{dev.device_kind}",
        "gpu": "none available this session",
    }
    res["bandwidth_gbs"] = bw = bandwidth_gbs()
    print(f"device {res['device']}  measured bandwidth {bw:.2f} GB/s", flush=True)
    res["memory"] = mem = memory(args.T_mem)
    ref = mem["reference"]["temp_bytes"]
    print(f"ratio chunked/reference temp = {mem['chunked']['temp_bytes'] / ref:.3f} (limit 0.35)")
    ref_h = mem["reference+lm_head"]["temp_bytes"]
    print(
        f"ratio fused_lm_head/(reference+lm_head) temp = {mem['fused_lm_head']['temp_bytes'] / ref_h:.3f} (limit 0.15)"
    )
    ts = timing(args.T_time, args.rounds, ("reference", "chunked"))
    res["time_s"] = ts
    med = {k: statistics.median(v) for k, v in ts.items()}
    for T in (args.T_time, args.T_mem):
        floor_s = 3 * T * V * 2 / (bw * 1e9)
        res[f"floor_s_T{T}"] = floor_s
        print(f"physical floor T={T}: 3 x {T * V * 2 / 1e9:.3f} GB / {bw:.2f} GB/s = {floor_s * 1e3:.1f} ms")
    floor = res[f"floor_s_T{args.T_time}"]
    for k, v in med.items():
        print(f"time T={args.T_time} {k:10s} median {v * 1e3:8.1f} ms  runs {[round(x * 1e3) for x in ts[k]]}  "
              f"x floor {v / floor:.1f}")  # fmt: skip
    print(f"ratio chunked/reference time = {med['chunked'] / med['reference']:.3f} (limit 1.2)")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
