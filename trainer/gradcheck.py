"""`python -m trainer.gradcheck {grpo,ce}`: every loss implementation's value and gradients against the reference.

Dims: B batch, T tokens, V vocab, D hidden. Inputs are fresh random draws: advantages of both signs, old and
reference log-probs away from the new ones, a chosen id in every 128-column vocab tile, padding masks,
temperature 0.7. `grpo` differentiates the real training loss (trainer/grpo/loss.py, every aggregation in
OBJECTIVES) through each kernel; `ce` a masked mean cross-entropy. Prints one `metrics: {json}` line
(docs/contracts.md): per impl the worst relative difference over the objectives, and each objective's under
`by_objective`; exit 0 within tolerance, 1 beyond, 2 a bad argument.
"""

from __future__ import annotations

import argparse
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


# The GRPO objectives checked, all through trainer/grpo/loss.py's grpo_objective on the kernels' log-probs and
# entropies: each of the four aggregations, the KL term (beta > 0) once; default clip range, which the random
# ratios fall on both sides of. The entropy bonus weighs 1 (more than in training): GRPO's surrogate alone sums
# terms of both advantage signs to a loss near 0, whose relative difference would measure that cancellation
# rather than the kernel; and the entropy's gradient then counts as much as the log-prob's.
OBJECTIVES: dict[str, dict[str, Any]] = {
    "dapo": {"loss_type": "dapo", "entropy_coef": 1.0},
    "grpo+kl": {"loss_type": "grpo", "beta": 0.1, "entropy_coef": 1.0},
    "bnpo": {"loss_type": "bnpo", "entropy_coef": 1.0},
    "dr_grpo": {"loss_type": "dr_grpo", "entropy_coef": 1.0},
}
DAPO_TOKENS_SCALE = 1.5


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
        "shift": jnp.asarray(rng.normal(0, 0.5, (B, T)), jnp.float32),
        "ref_shift": jnp.asarray(rng.normal(0, 0.5, (B, T)), jnp.float32),
    }


def inputs(config: str, dtype: str, seed: int) -> dict[str, Any]:
    """draw_inputs plus, for each path (from logits, from hidden), the sampling and reference policies'
    log-probs, both away from that path's current ones: ratios on both sides of the clip range, a KL not ~0."""
    import jax.numpy as jnp

    from trainer import kernels

    x = draw_inputs(CONFIGS[config], dtype, seed)
    h_logits = jnp.matmul(x["hidden"].astype(jnp.float32), x["w"].astype(jnp.float32))
    for path, z in (("logits", x["logits"]), ("hidden", h_logits)):
        logp, _ = kernels.token_logprob_entropy(z, x["ids"], temperature=TEMPERATURE, impl="reference")
        x[f"old_logp_{path}"] = logp + x["shift"]
        x[f"ref_logp_{path}"] = logp + x["ref_shift"]
    return x


def grpo_loss(name: str, logp_BT: Any, entropy_BT: Any, x: dict[str, Any], path: str) -> Any:
    """The training loss of objective `name` (OBJECTIVES) on these log-probs and entropies."""
    from trainer.config import LossConfig
    from trainer.grpo.loss import grpo_objective

    cfg = LossConfig(**OBJECTIVES[name])
    ref = x[f"ref_logp_{path}"] if cfg.beta > 0 else None
    # dapo normalises by the step's mean tokens per micro-batch, which differs from this batch's own count
    # when micro-batches differ in length (else dapo would equal bnpo here).
    tokens = DAPO_TOKENS_SCALE * x["mask"].sum()
    return grpo_objective(
        logp_BT, x[f"old_logp_{path}"], ref, x["adv"], x["mask"], entropy_BT, cfg, dapo_tokens=tokens
    )[0]


def loss_fns(loss: str, impl: str, x: dict[str, Any], objective: str) -> tuple[Callable, Callable]:
    """(loss of logits, loss of (hidden, W)) for `impl`; impl "reference" is the float32 definition."""
    import jax.numpy as jnp

    from trainer import kernels

    def of_logits(z: Any) -> Any:
        if loss == "ce":
            return kernels.cross_entropy(z, x["ids"], x["mask"], impl=impl)
        lp, ent = kernels.token_logprob_entropy(z, x["ids"], temperature=TEMPERATURE, impl=impl)
        return grpo_loss(objective, lp, ent, x, "logits")

    def of_hidden(h: Any, w: Any) -> Any:
        if impl == "reference":  # the definition: float32 matmul, then the reference loss
            z = jnp.matmul(h.astype(jnp.float32), w.astype(jnp.float32))
            if loss == "ce":
                return kernels.cross_entropy(z, x["ids"], x["mask"], impl=impl)
            lp, ent = kernels.token_logprob_entropy(z, x["ids"], temperature=TEMPERATURE, impl=impl)
            return grpo_loss(objective, lp, ent, x, "hidden")
        if loss == "ce":
            return kernels.cross_entropy_from_hidden(h, w, x["ids"], x["mask"], impl=impl)
        lp, ent = kernels.token_logprob_entropy_from_hidden(
            h, w, x["ids"], temperature=TEMPERATURE, impl=impl
        )
        return grpo_loss(objective, lp, ent, x, "hidden")

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


def run(loss: str, config: str, dtype: str, impls: tuple[str, ...], seed: int = 0) -> dict[str, Any]:
    """Check `impls` against the reference; the metrics record (with "ok") as a dict."""
    import jax

    with jax.default_matmul_precision("highest"):  # float32 matmuls in full precision on TPU/GPU too
        return _run(loss, config, dtype, impls, seed)


def _value_and_grad(loss: str, impl: str, x: dict[str, Any], objective: str, of: str) -> Callable:
    """Jitted (value, gradient) of one objective w.r.t. the logits, or w.r.t. (hidden, W)."""
    import jax

    of_logits, of_hidden = loss_fns(loss, impl, x, objective)
    if of == "logits":
        return jax.jit(jax.value_and_grad(of_logits))
    return jax.jit(jax.value_and_grad(of_hidden, argnums=(0, 1)))


def _run(loss: str, config: str, dtype: str, impls: tuple[str, ...], seed: int) -> dict:
    import jax
    import jax.numpy as jnp

    x = inputs(config, dtype, seed)
    tol = TOLERANCE[dtype]
    by_objective: dict[str, dict[str, Any]] = {}
    # One objective at a time: at the qwen2.5-1.5b size each [B, T, V] gradient is 2.5 GB in float32.
    for name in tuple(OBJECTIVES) if loss == "grpo" else ("cross_entropy",):
        want_z = _value_and_grad(loss, "reference", x, name, "logits")(x["logits"].astype(jnp.float32))
        want_h = _value_and_grad(loss, "reference", x, name, "hidden")(x["hidden"], x["w"])
        by_objective[name] = {"reference_loss": float(want_z[0])}
        for impl in impls:
            rec: dict[str, Any]  # each gradient's differences, then whether all are within tolerance
            if impl == "fused_lm_head":
                v, (dh, dw) = _value_and_grad(loss, impl, x, name, "hidden")(x["hidden"], x["w"])
                rec = {
                    "loss": diff(v, want_h[0]),
                    "dhidden": diff(dh, want_h[1][0]),
                    "dw": diff(dw, want_h[1][1]),
                }
            else:
                v, dz = _value_and_grad(loss, impl, x, name, "logits")(x["logits"])
                rec = {"loss": diff(v, want_z[0]), "dlogits": diff(dz, want_z[1])}
            rec["ok"] = all(r["rel"] <= tol for r in rec.values())
            by_objective[name][impl] = rec
        del want_z, want_h
    out = {}
    for impl in impls:  # per implementation: each quantity's largest difference over the objectives
        recs = {name: by[impl] for name, by in by_objective.items()}
        worst: dict[str, Any] = {}
        for name, rec in recs.items():
            for q, d in rec.items():
                if q != "ok" and (q not in worst or d["rel"] > worst[q]["rel"]):
                    worst[q] = {**d, "objective": name}
        out[impl] = {**worst, "ok": all(rec["ok"] for rec in recs.values())}
    objective_name = "grpo_objective" if loss == "grpo" else "cross_entropy"
    return {"kind": "gradcheck", "loss": loss, "config": config, "dtype": dtype, "backend": jax.default_backend(),
            "tolerance_rel": tol, "objective": objective_name, "impls": out, "by_objective": by_objective,
            "ok": all(r["ok"] for r in out.values())}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """CLI entry: prints the metrics line; 0 within tolerance, 1 beyond, 2 a bad argument."""
    ap = argparse.ArgumentParser(prog="python -m trainer.gradcheck", description=__doc__)
    ap.add_argument("loss", choices=("grpo", "ce"))
    ap.add_argument("--config", choices=tuple(CONFIGS), default="small-cpu")
    ap.add_argument("--dtype", choices=tuple(TOLERANCE), default="float32")
    ap.add_argument(
        "--impl", default="all", help="one of reference|chunked|pallas|fused_lm_head|auto, or all"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from trainer import kernels, metrics
    from trainer.startup import start_platforms

    start_platforms()  # no TPU here: the CPU, without libtpu's start-up errors

    try:
        impls = kernels.IMPLS[1:] if args.impl == "all" else (kernels.resolve_impl(args.impl),)
    except ValueError as e:  # a bad argument, as argparse's own: exit 2
        print(f"gradcheck: --impl: {e}", file=sys.stderr)
        return 2
    rec = run(args.loss, args.config, args.dtype, impls, args.seed)
    metrics.Emitter().metrics(rec)
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
