"""The math every log-prob/entropy implementation shares: per-row statistics, their merge, the backward.

Dims: N rows (flattened batch x tokens), V vocab (or a vocab tile of it). Scaled logits s = z / temperature.
Statistics kept per row (O(N), float32): lse = log sum exp s, entropy H = lse - E_p[s], chosen logit s[id].
The backward needs nothing else (docs/kernels.md derives it):
    d/ds_j logp = onehot_j - p_j,     d/ds_j H = -p_j (log p_j + H),   p_j = exp(s_j - lse).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax

# A finite "minus infinity" for running maxima: exp(NEG - m) underflows to 0 without 0 * inf = NaN.
NEG = -1e30


def scaled(z_NV: Array, temperature: float) -> Array:
    """float32 logits divided by the sampling temperature."""
    return z_NV.astype(jnp.float32) * (1.0 / temperature)


def row_stats(s_NV: Array, ids_N: Array, col0: Array | int = 0) -> tuple[Array, Array, Array, Array]:
    """Shifted partial statistics of one tile: max m, l = sum e^(s-m), b = sum e^(s-m)(s-m), chosen s.

    `col0` is the tile's first vocab column; columns are compared with ids to pick the chosen logit, so a
    tile that does not hold a row's id contributes 0 to it.
    """
    m_N = jnp.max(s_NV, axis=-1)
    d_NV = s_NV - m_N[:, None]
    e_NV = jnp.exp(d_NV)
    l_N = jnp.sum(e_NV, axis=-1)
    b_N = jnp.sum(e_NV * d_NV, axis=-1)
    cols_V = col0 + jnp.arange(s_NV.shape[-1])
    chosen_N = jnp.sum(jnp.where(cols_V[None, :] == ids_N[:, None], s_NV, 0.0), axis=-1)
    return m_N, l_N, b_N, chosen_N


def merge(a: tuple[Array, Array, Array], b: tuple[Array, Array, Array]) -> tuple[Array, Array, Array]:
    """Online-softmax merge of two shifted (m, l, b) triples into one relative to the larger max."""
    m1, l1, b1 = a
    m2, l2, b2 = b
    m = jnp.maximum(m1, m2)
    a1, a2 = jnp.exp(m1 - m), jnp.exp(m2 - m)
    # Re-shifting b from m_k to m: sum e^(s-m_k)(s-m) = b_k + l_k (m_k - m).
    return m, a1 * l1 + a2 * l2, a1 * (b1 + l1 * (m1 - m)) + a2 * (b2 + l2 * (m2 - m))


def finish(m_N: Array, l_N: Array, b_N: Array) -> tuple[Array, Array]:
    """(lse, entropy) from merged shifted statistics."""
    return m_N + jnp.log(l_N), jnp.log(l_N) - b_N / l_N


def dscaled(
    s_NV: Array,
    ids_N: Array,
    lse_N: Array,
    ent_N: Array,
    glogp_N: Array,
    gent_N: Array,
    col0: Array | int = 0,
) -> Array:
    """Cotangent of the scaled logits of one tile from the saved row statistics and output cotangents."""
    return dscaled_cols(
        s_NV, ids_N[:, None], lse_N[:, None], ent_N[:, None], glogp_N[:, None], gent_N[:, None], col0=col0
    )


def dscaled_cols(
    s_NV: Array,
    ids_N1: Array,
    lse_N1: Array,
    ent_N1: Array,
    glogp_N1: Array,
    gent_N1: Array,
    col0: Array | int = 0,
) -> Array:
    """`dscaled` with per-row values as [N, 1] columns (2-D only, as Mosaic TPU kernels want)."""
    logp_NV = s_NV - lse_N1
    p_NV = jnp.exp(logp_NV)
    cols_NV = col0 + lax.broadcasted_iota(jnp.int32, s_NV.shape, 1)
    onehot_NV = (cols_NV == ids_N1).astype(jnp.float32)
    return glogp_N1 * (onehot_NV - p_NV) - gent_N1 * p_NV * (logp_NV + ent_N1)
