"""`python -m trainer.microbench`: forward+backward time and memory of one loss implementation.

Dims: B batch, T tokens, V vocab, D hidden. The timed step is value_and_grad of a scalar that uses both
outputs (mean log-prob + 0.01 mean entropy) w.r.t. the logits, or w.r.t. (hidden, W) with `--hidden`
(`fused_lm_head` always takes the hidden path; the others then run lm_head matmul + loss). Prints one
`metrics: {json}` line (docs/contracts.md); W&B logging only with `--wandb` (mode from WANDB_MODE,
offline unless set).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Literal

import numpy as np

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "f32": "float32", "float32": "float32"}


def step_fn(impl: str, hidden: int | None, temperature: float = 1.0) -> Any:
    """The jitted loss+grad step for `impl` (logits path, or hidden path when `hidden` is set)."""
    import jax
    import jax.numpy as jnp

    from trainer import kernels

    def objective(lp: Any, ent: Any) -> Any:
        return jnp.mean(lp) + 0.01 * jnp.mean(ent)

    if hidden:

        def loss_h(h: Any, w: Any, ids: Any) -> Any:
            return objective(
                *kernels.token_logprob_entropy_from_hidden(h, w, ids, temperature=temperature, impl=impl)
            )

        return jax.jit(jax.value_and_grad(loss_h, argnums=(0, 1)))

    def loss_z(z: Any, ids: Any) -> Any:
        return objective(*kernels.token_logprob_entropy(z, ids, temperature=temperature, impl=impl))

    return jax.jit(jax.value_and_grad(loss_z))


def shapes(B: int, T: int, V: int, dtype: str, hidden: int | None) -> tuple[Any, ...]:
    """Abstract inputs of the step (for compile-only memory analysis)."""
    import jax
    import jax.numpy as jnp

    ids = jax.ShapeDtypeStruct((B, T), jnp.int32)
    if hidden:
        return jax.ShapeDtypeStruct((B, T, hidden), dtype), jax.ShapeDtypeStruct((hidden, V), dtype), ids
    return jax.ShapeDtypeStruct((B, T, V), dtype), ids


def compiled_memory(
    impl: str, B: int, T: int, V: int, dtype: str, hidden: int | None = None
) -> dict[str, int]:
    """XLA's compiled memory analysis of the step: temp, argument, output and generated-code bytes."""
    m = step_fn(impl, hidden).lower(*shapes(B, T, V, dtype, hidden)).compile().memory_analysis()
    return {
        "temp_bytes": int(m.temp_size_in_bytes),
        "argument_bytes": int(m.argument_size_in_bytes),
        "output_bytes": int(m.output_size_in_bytes),
        "code_bytes": int(m.generated_code_size_in_bytes),
    }


def random_inputs(B: int, T: int, V: int, dtype: str, hidden: int | None, seed: int = 0) -> tuple[Any, ...]:
    """Fresh random inputs on the default device."""
    import jax
    import jax.numpy as jnp

    k = jax.random.split(jax.random.key(seed), 3)
    ids = jax.random.randint(k[0], (B, T), 0, V, jnp.int32)
    if hidden:
        h = jax.random.normal(k[1], (B, T, hidden), dtype)
        return h, (jax.random.normal(k[2], (hidden, V), jnp.float32) / np.sqrt(hidden)).astype(dtype), ids
    return (jax.random.normal(k[1], (B, T, V), jnp.float32) * 2).astype(dtype), ids


def time_step(fn: Any, args: tuple[Any, ...], iters: int) -> list[float]:
    """Seconds per call over `iters` calls after one warm-up call."""
    import jax

    jax.block_until_ready(fn(*args))
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        out.append(time.perf_counter() - t0)
    return out


def measure(
    impl: str, B: int, T: int, V: int, dtype: str, iters: int, hidden: int | None = None
) -> dict[str, Any]:
    """The microbench record for one implementation."""
    import jax

    from trainer import kernels

    name = kernels.resolve_impl(impl)
    hidden = hidden or (1536 if name == "fused_lm_head" else None)
    dev = jax.devices()[0]
    rec: dict[str, Any] = {"kind": "microbench", "impl": name, "B": B, "T": T, "V": V, "dtype": dtype,
                           "hidden": hidden, "iters": iters, "backend": dev.platform, "device": dev.device_kind}  # fmt: skip
    # Off TPU the Pallas kernels run in interpret mode: correct, but its figures are not a kernel's.
    rec["interpret"] = name == "pallas" and dev.platform != "tpu"
    rec.update(compiled_memory(name, B, T, V, dtype, hidden))
    ts = np.asarray(time_step(step_fn(name, hidden), random_inputs(B, T, V, dtype, hidden), iters)) * 1e3
    rec.update({"mean_ms": float(ts.mean()), "p50_ms": float(np.percentile(ts, 50)),
                "p90_ms": float(np.percentile(ts, 90))})  # fmt: skip
    stats = dev.memory_stats() or {}
    rec["peak_bytes"] = int(stats["peak_bytes_in_use"]) if "peak_bytes_in_use" in stats else None
    rec["floor_bytes"] = 3 * B * T * V * np.dtype(dtype).itemsize  # logits read twice, dlogits written once
    return rec


def log_wandb(rec: dict[str, Any]) -> None:
    """One W&B run holding the record (offline unless WANDB_MODE says otherwise)."""
    import wandb

    modes: dict[str, Literal["online", "offline", "disabled", "shared"]] = {
        "online": "online", "offline": "offline", "disabled": "disabled", "shared": "shared",
    }  # fmt: skip
    mode = modes.get(os.environ.get("WANDB_MODE", "offline"))
    if mode is None:
        raise SystemExit(f"WANDB_MODE={os.environ['WANDB_MODE']!r}: expected one of {', '.join(modes)}")
    run = wandb.init(project=os.environ.get("WANDB_PROJECT", "tpuops-microbench"), job_type="microbench",
                     mode=mode, config=rec)  # fmt: skip
    run.summary.update({k: v for k, v in rec.items() if isinstance(v, int | float)})
    run.finish()


def main(argv: list[str] | None = None) -> int:
    """CLI entry: prints the metrics line; 0 measured, 1 failed, 2 a bad argument."""
    ap = argparse.ArgumentParser(prog="python -m trainer.microbench", description=__doc__)
    ap.add_argument("--impl", default="chunked", help="reference|chunked|pallas|fused_lm_head|auto")
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--V", type=int, default=151936)
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=None, help="hidden size: time lm_head matmul + loss")
    ap.add_argument("--wandb", action="store_true", help="also log the record to W&B")
    args = ap.parse_args(argv)
    from trainer import kernels, metrics
    from trainer.startup import start_platforms

    start_platforms()  # no TPU here: the CPU, without libtpu's start-up errors

    try:
        kernels.resolve_impl(args.impl)
        sizes = {
            "--B": args.B,
            "--T": args.T,
            "--V": args.V,
            "--iters": args.iters,
            "--hidden": args.hidden or 1,
        }
        for flag, value in sizes.items():
            if value <= 0:
                raise ValueError(f"{flag} must be > 0, received {value}")
    except ValueError as e:  # a bad argument, as argparse's own: exit 2
        print(f"microbench: {e}", file=sys.stderr)
        return 2
    try:
        rec = measure(args.impl, args.B, args.T, args.V, DTYPES[args.dtype], args.iters, args.hidden)
    except (ValueError, RuntimeError) as e:
        print(f"microbench failed: {e}", file=sys.stderr)
        return 1
    metrics.Emitter().metrics(rec)
    if args.wandb or os.environ.get("TRAINER_WANDB") == "1":
        log_wandb(rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
