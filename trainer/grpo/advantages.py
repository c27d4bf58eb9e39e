"""Group-relative advantages: each completion's reward against the other completions of the same prompt."""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array

STD_EPS = 1e-4


def group_advantages(rewards_N: Array, group_size: int, scale: str = "group") -> Array:
    """rewards [N] with N = prompts × G, grouped consecutively -> advantages [N].

    scale="group": (r − mean_group) / (std_group + 1e-4), std with Bessel's correction (GRPO as published);
    scale="none": r − mean_group only (Dr. GRPO: no per-group std scaling, which biases toward easy prompts).
    """
    r_PG = rewards_N.reshape(-1, group_size).astype(jnp.float32)
    centred_PG = r_PG - r_PG.mean(axis=1, keepdims=True)
    if scale == "none":
        return centred_PG.reshape(-1)
    if scale != "group":
        raise ValueError(f"scale must be 'group' or 'none', received {scale!r}")
    std_P1 = jnp.std(r_PG, axis=1, keepdims=True, ddof=1)
    # A group of equal rewards has nothing to learn: its advantages are 0, not the float32 rounding of its mean
    # (0.9 - mean(0.9 × 8) can be ~6e-8, and so can the std) divided by ~1e-4: that pushed every sampled token
    # of such a group down by an advantage of -6e-4.
    equal_P1 = r_PG.max(axis=1, keepdims=True) == r_PG.min(axis=1, keepdims=True)
    centred_PG = jnp.where(equal_P1, 0.0, centred_PG)
    return (centred_PG / (std_P1 + STD_EPS)).reshape(-1)
