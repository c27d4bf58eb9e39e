"""The jitted programs of a step: the optimizer, the GRPO loss of a micro-batch, the accumulated update and
the reference log-probs (trainer.fit compiles the same ones for a TPU).

Dims: B sequences of a micro-batch, S = P + C, C = rollout.max_new_tokens, D hidden.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from trainer.config import Config
from trainer.grpo.loss import grpo_objective
from trainer.kernels import token_logprob_entropy_from_hidden
from trainer.layout import OnMesh
from trainer.model.qwen2 import forward_hidden, lm_head_weight


def optimizer(cfg: Config) -> optax.GradientTransformation:
    t = cfg.train
    schedule = optax.warmup_cosine_decay_schedule(
        0.0 if t.warmup_steps else t.learning_rate,
        t.learning_rate,
        max(t.warmup_steps, 1),
        max(t.steps, 2),
        0.1 * t.learning_rate,
    )
    if t.optimizer == "lion":
        opt = optax.lion(schedule, weight_decay=t.weight_decay)
    else:
        opt = optax.adamw(schedule, weight_decay=t.weight_decay)
    return optax.chain(optax.clip_by_global_norm(t.max_grad_norm), opt)


def completion_logp(
    params: Any, mconf: Any, mb: dict[str, jax.Array], P_len: int, cfg: Config, impl: str
) -> tuple[jax.Array, jax.Array]:
    """(log p, entropy) [B, C] of the completion tokens under `params`, on temperature-scaled logits."""
    C = cfg.rollout.max_new_tokens
    hidden_BSD = forward_hidden(params, mconf, mb["ids"], mb["pos"], mb["mask"])
    h_BCD = hidden_BSD[:, P_len - 1 : P_len - 1 + C]  # position t predicts token t + 1
    return token_logprob_entropy_from_hidden(
        h_BCD, lm_head_weight(params, mconf), mb["comp"], temperature=cfg.rollout.temperature, impl=impl
    )


def make_loss_fn(cfg: Config, mconf: Any, P_len: int, impl: str) -> Any:
    """loss_fn(params, micro_batch, dapo_tokens) -> (loss, aux): the GRPO objective of one micro-batch."""

    def loss_fn(params: Any, mb: dict[str, jax.Array], dapo_tokens: jax.Array) -> tuple[jax.Array, Any]:
        logp_BC, ent_BC = completion_logp(params, mconf, mb, P_len, cfg, impl)
        ref = mb.get("ref_logp") if cfg.loss.beta > 0 else None
        return grpo_objective(
            logp_BC,
            mb["old_logp"],
            ref,
            mb["adv"],
            mb["comp_mask"],
            ent_BC,
            cfg.loss,
            dapo_tokens=dapo_tokens,
        )

    return loss_fn


def make_update(
    cfg: Config, mconf: Any, opt: optax.GradientTransformation, P_len: int, impl: str, like: tuple[Any, Any]
) -> OnMesh:
    """One jitted step: mean of the micro-batch gradients (lax.scan), applied once; traced on the params' mesh
    with each decoder layer rematerialised per train.remat.

    Outputs keep the inputs' shardings (`like` = (params, opt_state)): if XLA chose its own, the next step's
    inputs would differ and the update would compile again.
    """
    n_micro = cfg.accumulation_steps
    loss_fn = make_loss_fn(cfg, mconf.replace(remat=cfg.train.remat), P_len, impl)

    def update(
        params: Any, opt_state: Any, batch: dict[str, jax.Array]
    ) -> tuple[Any, Any, dict[str, jax.Array]]:
        dapo_tokens = batch["comp_mask"].sum().astype(jnp.float32) / n_micro
        micro = jax.tree_util.tree_map(lambda x: x.reshape(n_micro, -1, *x.shape[1:]), batch)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)

        def body(acc: Any, mb: dict[str, jax.Array]) -> tuple[Any, Any]:
            (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb, dapo_tokens)
            return jax.tree_util.tree_map(jnp.add, acc, grads), (loss, aux)

        grads, (losses, auxes) = jax.lax.scan(body, zeros, micro)
        grads = jax.tree_util.tree_map(lambda g: g / n_micro, grads)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        out = {"loss": losses.mean(), "grad_norm": optax.global_norm(grads)}
        out.update({k: v.mean() for k, v in auxes.items()})
        return params, opt_state, out

    shardings = jax.tree_util.tree_map(lambda x: x.sharding, like)
    mesh = jax.tree_util.tree_leaves(shardings)[0].mesh
    return OnMesh(jax.jit(update, donate_argnums=(0, 1), out_shardings=(*shardings, None)), mesh)


def make_ref_logp(cfg: Config, mconf: Any, impl: str, mesh: Any) -> OnMesh:
    """ref_logp(ref_params, batch, P) -> the frozen reference policy's log-probs [N, C] (no gradient)."""

    def ref_logp(params: Any, b: dict[str, jax.Array], P_len: int) -> jax.Array:
        logp, _ = completion_logp(params, mconf, b, P_len, cfg, impl)
        return jax.lax.stop_gradient(logp)

    return OnMesh(jax.jit(ref_logp, static_argnums=2), mesh)
