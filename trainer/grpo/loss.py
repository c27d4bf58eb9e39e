"""The GRPO objective, per token then aggregated; pure functions of log-probs (no model, no kernel).

Dims: B sequences, T completion tokens. In plain words, this is GRPO with PPO's clipped surrogate:
each token's probability ratio r = exp(logp − old_logp) against the policy that sampled it is clipped to
[1 − epsilon_low, 1 + epsilon_high] (asymmetric "clip-higher" when epsilon_high > epsilon_low), the
sequence's group-relative advantage A multiplies it, and the pessimistic minimum is taken:
    loss_t = −min(r·A, clip(r)·A) + beta·KL_t − entropy_coef·H_t,
with KL_t the k3 estimator exp(ref − logp) − (ref − logp) − 1 against a frozen reference policy. The
per-token losses are aggregated as TRL defines the four variants:
    grpo    mean over sequences of each sequence's token mean;
    bnpo    token mean over the (micro-)batch;
    dr_grpo token sum / (B × max_completion_len), a constant normaliser (Dr. GRPO);
    dapo    token sum / the number of active tokens in the whole step (across micro-batches), so
            gradient accumulation does not change the loss (DAPO's token-level loss).
On a multislice each slice holds part of every micro-batch: given the whole micro-batch's rows and active
tokens (`whole`), a slice's loss and statistics are its share, and the slices' shares sum to the micro-batch's.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import Array

from trainer.config import LossConfig


def per_token_loss(
    logp_BT: Array,
    old_logp_BT: Array,
    ref_logp_BT: Array | None,
    adv_B: Array,
    entropy_BT: Array,
    cfg: LossConfig,
) -> tuple[Array, dict[str, Array]]:
    ratio_BT = jnp.exp(logp_BT - old_logp_BT)
    adv_B1 = adv_B[:, None]
    clipped_BT = jnp.clip(ratio_BT, 1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high)
    loss_BT = -jnp.minimum(ratio_BT * adv_B1, clipped_BT * adv_B1)
    parts = {
        "ratio": ratio_BT,
        "clipped_low": (ratio_BT < 1.0 - cfg.epsilon_low) & (adv_B1 < 0),
        "clipped_high": (ratio_BT > 1.0 + cfg.epsilon_high) & (adv_B1 > 0),
    }
    if ref_logp_BT is not None and cfg.beta > 0:
        delta_BT = ref_logp_BT - logp_BT
        kl_BT = jnp.exp(delta_BT) - delta_BT - 1.0
        loss_BT = loss_BT + cfg.beta * kl_BT
        parts["kl"] = kl_BT
    if cfg.entropy_coef:
        loss_BT = loss_BT - cfg.entropy_coef * entropy_BT
    return loss_BT, parts


def aggregate(
    loss_BT: Array,
    mask_BT: Array,
    cfg: LossConfig,
    *,
    dapo_tokens: Array | float | None = None,
    whole: tuple[int, Array] | None = None,
) -> Array:
    """One scalar from per-token losses; `dapo_tokens` is the step's active-token count per micro-batch.
    `whole` = (rows, active tokens) of the micro-batch these rows are part of (default: these rows alone)."""
    m_BT = mask_BT.astype(jnp.float32)
    rows, active = whole if whole is not None else (loss_BT.shape[0], m_BT.sum())
    total = (loss_BT * m_BT).sum()
    if cfg.loss_type == "grpo":
        per_seq_B = (loss_BT * m_BT).sum(axis=1) / jnp.maximum(m_BT.sum(axis=1), 1.0)
        return per_seq_B.sum() / rows
    if cfg.loss_type == "bnpo":
        return total / jnp.maximum(active, 1.0)
    if cfg.loss_type == "dr_grpo":
        width = cfg.max_completion_len or loss_BT.shape[1]
        return total / (rows * width)
    if cfg.loss_type == "dapo":
        tokens = m_BT.sum() if dapo_tokens is None else dapo_tokens
        return total / jnp.maximum(tokens, 1.0)
    raise ValueError(f"loss_type must be grpo, bnpo, dr_grpo or dapo, received {cfg.loss_type!r}")


def grpo_objective(
    logp_BT: Array,
    old_logp_BT: Array,
    ref_logp_BT: Array | None,
    adv_B: Array,
    mask_BT: Array,
    entropy_BT: Array,
    cfg: LossConfig,
    *,
    dapo_tokens: Array | float | None = None,
    whole: tuple[int, Array] | None = None,
) -> tuple[Array, dict[str, Any]]:
    """(loss, aux): the aggregated GRPO loss and masked means of ratio, clip fractions, KL and entropy (with
    `whole`, this part's shares of the micro-batch's: see `aggregate`)."""
    loss_BT, parts = per_token_loss(logp_BT, old_logp_BT, ref_logp_BT, adv_B, entropy_BT, cfg)
    loss = aggregate(loss_BT, mask_BT, cfg, dapo_tokens=dapo_tokens, whole=whole)
    m_BT = mask_BT.astype(jnp.float32)
    n = jnp.maximum(m_BT.sum() if whole is None else whole[1], 1.0)

    def mean(x_BT: Array) -> Array:
        return (x_BT.astype(jnp.float32) * m_BT).sum() / n

    old_delta_BT = old_logp_BT - logp_BT
    aux = {
        "entropy": mean(entropy_BT),
        "ratio_mean": mean(parts["ratio"]),
        # KL(policy || the policy that sampled), k3 on the sampled tokens: ~0 on the first PPO epoch
        # (the same parameters; more means the sampler and the trainer disagree), growing with later epochs.
        "kl_old": mean(jnp.maximum(jnp.exp(old_delta_BT) - old_delta_BT - 1.0, 0.0)),  # >= 0 (rounding)
        "clip_low_frac": mean(parts["clipped_low"]),
        "clip_high_frac": mean(parts["clipped_high"]),
    }
    if "kl" in parts:
        aux["kl"] = mean(parts["kl"])
    return loss, aux
