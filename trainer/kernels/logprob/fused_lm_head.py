"""Log-prob and entropy straight from hidden states and the LM-head weight, never materialising [N, V] logits.

Dims: N rows (flattened B x T), D hidden, V vocab. Forward: row chunks, logits tile = h_chunk @ W in float32,
keep O(N) statistics. Backward: vocab chunks (outer) x row chunks (inner) recompute the logits tile and
accumulate dh += dz @ W_tile^T and dW_tile = h^T @ dz, so the largest temporary is one rows x vocab tile.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
from jax import Array, lax

from trainer.kernels.logprob import softmax_stats as st
from trainer.kernels.logprob.blocks import BlockSizes, for_device
from trainer.kernels.logprob.chunked import row_loop


def _tile_logits(h_cD: Array, w_Dv: Array, temperature: float) -> Array:
    return jnp.matmul(h_cD, w_Dv, preferred_element_type=jnp.float32) * (1.0 / temperature)


def forward_stats(
    h_ND: Array, w_DV: Array, ids_N: Array, temperature: float, blocks: BlockSizes
) -> tuple[Array, Array, Array]:
    """(lse, entropy, chosen scaled logit), float32 [N], one row chunk of full-vocab logits at a time."""

    def body(start: Array, c: int, carry: tuple[Array, Array, Array]) -> tuple[Array, Array, Array]:
        s_cV = _tile_logits(lax.dynamic_slice_in_dim(h_ND, start, c), w_DV, temperature)
        m, s1, b, chosen = st.row_stats(s_cV, lax.dynamic_slice_in_dim(ids_N, start, c))
        lse, ent = st.finish(m, s1, b)
        lse_N, ent_N, chosen_N = (
            lax.dynamic_update_slice_in_dim(a, v, start, 0)
            for a, v in zip(carry, (lse, ent, chosen), strict=True)
        )
        return lse_N, ent_N, chosen_N

    zeros = jnp.zeros((h_ND.shape[0],), jnp.float32)
    return row_loop(h_ND.shape[0], blocks.rows, body, (zeros, zeros, zeros))


def backward(
    h_ND: Array, w_DV: Array, ids_N: Array, lse_N: Array, ent_N: Array, g: tuple[Array, Array],
    temperature: float, blocks: BlockSizes,
) -> tuple[Array, Array]:  # fmt: skip
    """(dh [N, D], dW [D, V]) in the inputs' dtypes from the saved statistics and output cotangents."""
    n, v = h_ND.shape[0], w_DV.shape[1]
    glogp_N, gent_N = (x.astype(jnp.float32) for x in g)
    cv, cr = min(blocks.vocab, v), min(blocks.rows, n)

    def vocab_step(j: Array, carry: tuple[Array, Array]) -> tuple[Array, Array]:
        dh_ND, dw_DV = carry
        v0 = jnp.minimum(j * cv, v - cv)
        w_Dv = lax.dynamic_slice_in_dim(w_DV, v0, cv, axis=1)
        # The last vocab tile is shifted back to end at V: its columns before j*cv were done already.
        new_v = (v0 + jnp.arange(cv)) >= j * cv

        def row_step(i: Array, inner: tuple[Array, Array]) -> tuple[Array, Array]:
            dh_ND, dw_Dv = inner
            r0 = jnp.minimum(i * cr, n - cr)
            new_r = (r0 + jnp.arange(cr)) >= i * cr

            def sl(a: Array) -> Array:
                return lax.dynamic_slice_in_dim(a, r0, cr)

            h_cD = sl(h_ND)
            ds = st.dscaled(_tile_logits(h_cD, w_Dv, temperature), sl(ids_N), sl(lse_N), sl(ent_N),
                            sl(glogp_N), sl(gent_N), col0=v0)  # fmt: skip
            dz_cv = (jnp.where(new_r[:, None] & new_v[None, :], ds, 0.0) / temperature).astype(h_ND.dtype)
            dh_cD = sl(dh_ND) + jnp.matmul(dz_cv, w_Dv.T, preferred_element_type=jnp.float32)
            dw_Dv = dw_Dv + jnp.matmul(h_cD.T, dz_cv, preferred_element_type=jnp.float32)
            return lax.dynamic_update_slice_in_dim(dh_ND, dh_cD, r0, 0), dw_Dv

        dh_ND, dw_Dv = lax.fori_loop(0, -(-n // cr), row_step, (dh_ND, jnp.zeros(w_Dv.shape, jnp.float32)))
        old_Dv = lax.dynamic_slice_in_dim(dw_DV, v0, cv, axis=1)
        dw_Dv = jnp.where(new_v[None, :], dw_Dv.astype(w_DV.dtype), old_Dv)
        return dh_ND, lax.dynamic_update_slice_in_dim(dw_DV, dw_Dv, v0, axis=1)

    init = (jnp.zeros(h_ND.shape, jnp.float32), jnp.zeros_like(w_DV))
    dh_ND, dw_DV = lax.fori_loop(0, -(-v // cv), vocab_step, init)
    return dh_ND.astype(h_ND.dtype), dw_DV


def with_recompute_vjp(forward_stats: Callable, backward: Callable) -> Callable:
    """(h_ND, w_DV, ids_N, temperature, blocks) -> (logp_N, entropy_N) whose VJP keeps only the O(N) row
    statistics and calls `backward` (which recomputes logits tiles); shared with pallas_lm_head."""

    @partial(jax.custom_vjp, nondiff_argnums=(3, 4))
    def fused(h_ND: Array, w_DV: Array, ids_N: Array, temperature: float, blocks: BlockSizes) -> tuple:
        lse, ent, chosen = forward_stats(h_ND, w_DV, ids_N, temperature, blocks)
        return chosen - lse, ent

    def fwd(h_ND: Array, w_DV: Array, ids_N: Array, temperature: float, blocks: BlockSizes) -> tuple:
        lse, ent, chosen = forward_stats(h_ND, w_DV, ids_N, temperature, blocks)
        return (chosen - lse, ent), (h_ND, w_DV, ids_N, lse, ent)

    def bwd(temperature: float, blocks: BlockSizes, res: tuple, g: tuple[Array, Array]) -> tuple:
        h_ND, w_DV, ids_N, lse, ent = res
        dh_ND, dw_DV = backward(h_ND, w_DV, ids_N, lse, ent, g, temperature, blocks)
        return dh_ND, dw_DV, None

    fused.defvjp(fwd, bwd)
    return fused


_fused = with_recompute_vjp(forward_stats, backward)


def token_logprob_entropy_from_hidden(
    hidden_BTD: Array,
    w_DV: Array,
    ids_BT: Array,
    *,
    temperature: float = 1.0,
    blocks: BlockSizes | None = None,
) -> tuple[Array, Array]:
    """log p(ids) and entropy of softmax(hidden @ W / temperature), float32 [B, T], without [B, T, V] logits."""
    *lead, d = hidden_BTD.shape
    if w_DV.shape[0] != d:
        raise ValueError(f"w_DV must be [D={d}, V], received shape {tuple(w_DV.shape)}")
    blocks = blocks or for_device("fused_lm_head")
    logp_N, ent_N = _fused(
        hidden_BTD.reshape(-1, d), w_DV, ids_BT.reshape(-1).astype(jnp.int32), float(temperature), blocks
    )
    return logp_N.reshape(lead), ent_N.reshape(lead)
