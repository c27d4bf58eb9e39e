"""`python -m trainer.gradcheck {grpo,ce}`: every loss implementation's value and gradients against the reference.

Dims: B batch, T tokens, V vocab, D hidden. Inputs are fresh random draws: advantages of both signs, old
log-probs away from the new ones, a chosen id in every 128-column vocab tile, padding masks, temperature
0.7. Prints one `metrics: {json}` line (docs/contracts.md); exit 0 within tolerance, 1 beyond.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# Largest |impl - reference| over largest |reference|, per compared array, by input dtype. bfloat16: the
# kernels return dlogits (dhidden, dW) in the input dtype, so one bf16 rounding (2^-8) is expected.
TOLERANCE = {"float32": 2e-5, "bfloat16": 1e-2}
TEMPERATURE = 0.7


@dataclass(frozen=True)
class Case:
    """One gradcheck size."""

    B: int
    T: int
    V: int
    D: int


CONFIGS = {"small-cpu": Case(B=2, T=24, V=1000, D=64), "qwen2.5-1.5b": Case(B=1, T=4096, V=151936, D=1536)}


def draw_inputs(case: Case, dtype: str, seed: int) -> dict[str, Any]:
    """Random inputs for one check (see the module docstring for what they must exercise)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    B, T, V, D = case.B, case.T, case.V, case.D
    ids = rng.integers(0, V, size=B * T)
    tiles = np.arange(0, V, 128)
    ids[: len(tiles)] = np.minimum(tiles + rng.integers(0, 128, size=len(tiles)), V - 1)
    ids = rng.permutation(ids).reshape(B, T)
    lengths = rng.integers(T // 2, T, size=B)
    lengths[0] = T  # one full row, the others padded
    adv = rng.uniform(0.2, 2.0, size=B) * np.where(np.arange(B) % 2 == 0, 1.0, -1.0)
    return {
        "logits": jnp.asarray(2 * rng.standard_normal((B, T, V), np.float32), dtype),
        "hidden": jnp.asarray(rng.normal(0, 1.0, (B, T, D)), dtype),
        "w": jnp.asarray(rng.normal(0, 2.0 / np.sqrt(D), (D, V)), dtype),
        "ids": jnp.asarray(ids, jnp.int32),
        "mask": jnp.asarray(np.arange(T)[None, :] < lengths[:, None], jnp.float32),
        "adv": jnp.asarray(adv, jnp.float32),
        "probe": jnp.asarray(rng.normal(0, 1.0, (B, T)), jnp.float32),
        "shift": jnp.asarray(rng.normal(0, 0.5, (B, T)), jnp.float32),
    }


def probe_objective(logp_BT: Any, entropy_BT: Any, x: dict[str, Any]) -> Any:
    """Stand-in for trainer/grpo/loss.py's objective (not there yet): a masked functional of both outputs,
    nonlinear in logp through exp(logp - old_logp), with advantages of both signs."""
    import jax.numpy as jnp

    ratio_BT = jnp.exp(logp_BT - x["old_logp"])
    per_tok_BT = -x["adv"][:, None] * ratio_BT + 0.1 * x["probe"] * entropy_BT
    return jnp.sum(per_tok_BT * x["mask"]) / jnp.sum(x["mask"])


Objective = Callable[[Any, Any, dict[str, Any]], Any]


def loss_fns(loss: str, impl: str, x: dict[str, Any], objective: Objective) -> tuple[Callable, Callable]:
    """(loss of logits, loss of (hidden, W)) for `impl`; impl "reference" is the float32 definition."""
    import jax.numpy as jnp

    from trainer import kernels

    def of_logits(z: Any) -> Any:
        if loss == "ce":
            return kernels.cross_entropy(z, x["ids"], x["mask"], impl=impl)
        lp, ent = kernels.token_logprob_entropy(z, x["ids"], temperature=TEMPERATURE, impl=impl)
        return objective(lp, ent, x)

    def of_hidden(h: Any, w: Any) -> Any:
        if impl == "reference":  # the definition: float32 matmul, then the reference loss
            return of_logits(jnp.matmul(h.astype(jnp.float32), w.astype(jnp.float32)))
        if loss == "ce":
            return kernels.cross_entropy_from_hidden(h, w, x["ids"], x["mask"], impl=impl)
        lp, ent = kernels.token_logprob_entropy_from_hidden(
            h, w, x["ids"], temperature=TEMPERATURE, impl=impl
        )
        return objective(lp, ent, x)

    return of_logits, of_hidden


def diff(a: Any, b: Any) -> dict[str, float]:
    """max/mean absolute and max relative (to the reference's largest magnitude) difference."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = np.abs(a - b)
    return {
        "max_abs": float(d.max()),
        "mean_abs": float(d.mean()),
        "rel": float(d.max() / max(np.abs(b).max(), 1e-30)),
    }


def run(loss: str, config: str, dtype: str, impls: tuple[str, ...], seed: int = 0,
        objective: Objective = probe_objective) -> dict[str, Any]:  # fmt: skip
    """Check `impls` against the reference; the metrics record (with "ok") as a dict."""
    import jax

    with jax.default_matmul_precision("highest"):  # float32 matmuls in full precision on TPU/GPU too
        return _run(loss, config, dtype, impls, seed, objective)


def _run(loss: str, config: str, dtype: str, impls: tuple[str, ...], seed: int, objective: Objective) -> dict:
    import jax
    import jax.numpy as jnp

    from trainer import kernels

    x = draw_inputs(CONFIGS[config], dtype, seed)
    ref_logp, _ = kernels.token_logprob_entropy(
        x["logits"], x["ids"], temperature=TEMPERATURE, impl="reference"
    )
    x["old_logp"] = ref_logp + x["shift"]  # old != new: ratios well outside any clip range
    ref_z, ref_h = loss_fns(loss, "reference", x, objective)
    want_z = jax.jit(jax.value_and_grad(ref_z))(x["logits"].astype(jnp.float32))
    want_h = jax.jit(jax.value_and_grad(ref_h, argnums=(0, 1)))(x["hidden"], x["w"])
    tol, out, ok = TOLERANCE[dtype], {}, True
    for impl in impls:
        of_z, of_h = loss_fns(loss, impl, x, objective)
        if impl == "fused_lm_head":
            got = jax.jit(jax.value_and_grad(of_h, argnums=(0, 1)))(x["hidden"], x["w"])
            rec = {"loss": diff(got[0], want_h[0]), "dhidden": diff(got[1][0], want_h[1][0]),
                   "dw": diff(got[1][1], want_h[1][1])}  # fmt: skip
        else:
            got = jax.jit(jax.value_and_grad(of_z))(x["logits"])
            rec = {"loss": diff(got[0], want_z[0]), "dlogits": diff(got[1], want_z[1])}
        rec["ok"] = all(r["rel"] <= tol for r in rec.values())
        ok = ok and rec["ok"]
        out[impl] = rec
    objective_name = objective.__name__ if loss == "grpo" else "cross_entropy"
    return {"kind": "gradcheck", "loss": loss, "config": config, "dtype": dtype, "backend": jax.default_backend(),
            "tolerance_rel": tol, "objective": objective_name, "impls": out, "ok": ok}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """CLI entry: prints the metrics line, returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m trainer.gradcheck", description=__doc__)
    ap.add_argument("loss", choices=("grpo", "ce"))
    ap.add_argument("--config", choices=tuple(CONFIGS), default="small-cpu")
    ap.add_argument("--dtype", choices=tuple(TOLERANCE), default="float32")
    ap.add_argument(
        "--impl", default="all", help="one of reference|chunked|pallas|fused_lm_head|auto, or all"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from trainer import kernels

    impls = kernels.IMPLS[1:] if args.impl == "all" else (kernels.resolve_impl(args.impl),)
    rec = run(args.loss, args.config, args.dtype, impls, args.seed)
    print("metrics: " + json.dumps(rec, separators=(",", ":")), flush=True)
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
