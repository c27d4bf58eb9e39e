"""The definition: per-token log-prob and entropy of the temperature-scaled softmax in plain float32 JAX.

Dims: B batch, T tokens, V vocab. Autodiff gives the gradients; every other implementation is checked
against this one (trainer/gradcheck.py, tests/trainer/kernels/).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array


def token_logprob_entropy(
    logits_BTV: Array, ids_BT: Array, *, temperature: float = 1.0
) -> tuple[Array, Array]:
    """log p(ids) and entropy H(p) of softmax(logits / temperature), both float32 [B, T]."""
    logq_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32) / temperature, axis=-1)
    logp_BT = jnp.take_along_axis(logq_BTV, ids_BT[..., None].astype(jnp.int32), axis=-1)[..., 0]
    entropy_BT = -jnp.sum(jnp.exp(logq_BTV) * logq_BTV, axis=-1)
    return logp_BT, entropy_BT
