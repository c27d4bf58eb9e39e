"""The definition of masked-mean token cross-entropy in plain float32 JAX (dims: B batch, T tokens, V vocab)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array


def cross_entropy(logits_BTV: Array, labels_BT: Array, mask_BT: Array) -> Array:
    """sum(mask * -log softmax(logits)[label]) / max(sum(mask), 1), a float32 scalar."""
    logq_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    nll_BT = -jnp.take_along_axis(logq_BTV, labels_BT[..., None].astype(jnp.int32), axis=-1)[..., 0]
    mask_BT = mask_BT.astype(jnp.float32)
    return jnp.sum(nll_BT * mask_BT) / jnp.maximum(jnp.sum(mask_BT), 1.0)
