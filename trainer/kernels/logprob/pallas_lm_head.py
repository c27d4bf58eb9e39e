"""Log-prob and entropy from hidden states with the Pallas kernels: float32 logits one row chunk at a time.

Dims: N rows (flattened B x T), D hidden, V vocab, R rows per chunk. Forward: for each chunk, the logits
tile h_RD @ W_DV in float32 (an XLA matmul) and the Pallas forward kernel's statistics; only O(N) values are
kept. Backward: each chunk's logits are recomputed, the Pallas backward kernel writes dlogits, and
dh = dz @ W^T, dW += h^T @ dz. The largest temporary is R x V float32, never N x V.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax

from trainer.kernels.logprob import pallas_tpu
from trainer.kernels.logprob.blocks import BlockSizes, device_kind, for_device
from trainer.kernels.logprob.fused_lm_head import with_recompute_vjp

CHUNK_TILES = 4  # rows per chunk = CHUNK_TILES x BlockSizes.rows, and at least TPU_CHUNK_ROWS on a TPU
# Each chunk adds its [D, V] float32 weight gradient into the accumulator, which is read and written whole per
# chunk (1.2 GB at D = 2048 and Qwen2.5's vocabulary): on a TPU fewer, larger chunks move fewer bytes (the
# seed's update, 16 -> 4 chunks: 1,219 -> 1,160 GB of HBM, bound 1.042 -> 1.020 s; docs/performance.md). A
# chunk's float32 logits are rows x V x 4 bytes: 2.5 GB at 4096 rows.
TPU_CHUNK_ROWS = 4096


def _logits(h_RD: Array, w_DV: Array) -> Array:
    return jnp.matmul(h_RD, w_DV.astype(h_RD.dtype), preferred_element_type=jnp.float32)


def _chunks(n: int, blocks: BlockSizes) -> int:
    """Rows per chunk for `n` rows (a multiple of blocks.rows once padded): CHUNK_TILES tiles; on a TPU the most
    tiles up to TPU_CHUNK_ROWS that divide n's tiles, so no chunk is padded beyond the last tile."""
    tiles = -(-n // blocks.rows)
    if not device_kind().lower().startswith("tpu"):
        return min(CHUNK_TILES * blocks.rows, tiles * blocks.rows)
    most = max(TPU_CHUNK_ROWS // blocks.rows, 1)
    return max(k for k in range(1, min(most, tiles) + 1) if tiles % k == 0) * blocks.rows


def forward_stats(
    h_ND: Array, w_DV: Array, ids_N: Array, temperature: float, blocks: BlockSizes
) -> tuple[Array, Array, Array]:
    """(lse, entropy, chosen scaled logit), float32 [N]; N a multiple of the chunk."""
    n = h_ND.shape[0]
    r = _chunks(n, blocks)

    def body(i: Array, carry: tuple[Array, Array, Array]) -> tuple[Array, Array, Array]:
        h_RD = lax.dynamic_slice_in_dim(h_ND, i * r, r)
        ids_R = lax.dynamic_slice_in_dim(ids_N, i * r, r)
        stats = pallas_tpu.forward_stats(_logits(h_RD, w_DV), ids_R, temperature, blocks)
        lse_N, ent_N, chosen_N = (
            lax.dynamic_update_slice_in_dim(a, s, i * r, 0) for a, s in zip(carry, stats, strict=True)
        )
        return lse_N, ent_N, chosen_N

    zeros = jnp.zeros((n,), jnp.float32)
    return lax.fori_loop(0, n // r, body, (zeros, zeros, zeros))


def backward(
    h_ND: Array, w_DV: Array, ids_N: Array, lse_N: Array, ent_N: Array, g: tuple[Array, Array],
    temperature: float, blocks: BlockSizes,
) -> tuple[Array, Array]:  # fmt: skip
    """(dh [N, D], dW [D, V]) in the inputs' dtypes."""
    n = h_ND.shape[0]
    r = _chunks(n, blocks)
    glogp_N, gent_N = (x.astype(jnp.float32) for x in g)

    def body(i: Array, carry: tuple[Array, Array]) -> tuple[Array, Array]:
        dh_ND, dw_DV = carry

        def sl(a: Array) -> Array:
            return lax.dynamic_slice_in_dim(a, i * r, r)

        h_RD = sl(h_ND)
        dz_RV = pallas_tpu.backward_dlogits(
            _logits(h_RD, w_DV), sl(ids_N), sl(lse_N), sl(ent_N), (sl(glogp_N), sl(gent_N)), temperature,
            blocks, alias=True,
        ).astype(h_RD.dtype)  # fmt: skip
        dh_RD = jnp.matmul(dz_RV, w_DV.astype(h_RD.dtype).T, preferred_element_type=jnp.float32)
        dw_DV = dw_DV + jnp.matmul(h_RD.T, dz_RV, preferred_element_type=jnp.float32)
        return lax.dynamic_update_slice_in_dim(dh_ND, dh_RD.astype(h_ND.dtype), i * r, 0), dw_DV

    init = (jnp.zeros_like(h_ND), jnp.zeros(w_DV.shape, jnp.float32))
    dh_ND, dw_DV = lax.fori_loop(0, n // r, body, init)
    return dh_ND, dw_DV.astype(w_DV.dtype)


_fused = with_recompute_vjp(forward_stats, backward)


def token_logprob_entropy_from_hidden(
    hidden_BTD: Array,
    w_DV: Array,
    ids_BT: Array,
    *,
    temperature: float = 1.0,
    blocks: BlockSizes | None = None,
) -> tuple[Array, Array]:
    """log p(ids) and entropy of softmax(hidden @ W / temperature), float32 [B, T], with the Pallas kernels."""
    *lead, d = hidden_BTD.shape
    if w_DV.shape[0] != d:
        raise ValueError(f"w_DV must be [D={d}, V], received shape {tuple(w_DV.shape)}")
    blocks = (blocks or for_device("pallas")).check_dtype(jnp.float32)
    h_ND, ids_N = hidden_BTD.reshape(-1, d), ids_BT.reshape(-1).astype(jnp.int32)
    n = h_ND.shape[0]
    r = _chunks(n, blocks)
    pad = -n % r
    if pad:  # [N, D] rows are cheap to pad (the logits are never padded)
        h_ND, ids_N = jnp.pad(h_ND, ((0, pad), (0, 0))), jnp.pad(ids_N, (0, pad))
    logp_N, ent_N = _fused(h_ND, w_DV, ids_N, float(temperature), blocks)
    return logp_N[:n].reshape(lead), ent_N[:n].reshape(lead)
