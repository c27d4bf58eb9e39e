"""Log-prob and entropy in plain XLA, chunked over token rows, with a custom VJP that recomputes.

Dims: N rows (flattened B x T), V vocab. The forward keeps only O(N) float32 statistics (lse, entropy); the
backward re-reads each row chunk of the logits and writes its dlogits in the logits' dtype, so no float32
[N, V] array ever exists. Runs on every backend.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array, lax

from trainer.kernels.logprob import softmax_stats as st
from trainer.kernels.logprob.blocks import BlockSizes, for_device


def row_loop(n: int, chunk: int, body: Callable[[Array, int, Any], Any], init: Any) -> Any:
    """fori_loop over row chunks of size min(chunk, n); the last chunk is shifted back to end at n.

    The shifted last chunk overlaps its neighbour, so `body` must write per-row results (idempotent), which
    avoids padding (and so copying) the [N, V] input.
    """
    c = min(chunk, n)
    steps = -(-n // c)
    return lax.fori_loop(0, steps, lambda i, carry: body(jnp.minimum(i * c, n - c), c, carry), init)


def forward_stats(z_NV: Array, ids_N: Array, temperature: float, rows: int) -> tuple[Array, Array, Array]:
    """(lse, entropy, chosen scaled logit), each float32 [N]."""
    n = z_NV.shape[0]

    def body(start: Array, c: int, carry: tuple[Array, Array, Array]) -> tuple[Array, Array, Array]:
        s_cV = st.scaled(lax.dynamic_slice_in_dim(z_NV, start, c), temperature)
        m, s1, b, chosen = st.row_stats(s_cV, lax.dynamic_slice_in_dim(ids_N, start, c))
        lse, ent = st.finish(m, s1, b)
        lse_N, ent_N, chosen_N = (
            lax.dynamic_update_slice_in_dim(a, v, start, 0)
            for a, v in zip(carry, (lse, ent, chosen), strict=True)
        )
        return lse_N, ent_N, chosen_N

    zeros = jnp.zeros((n,), jnp.float32)
    return row_loop(n, rows, body, (zeros, zeros, zeros))


def backward_dlogits(
    z_NV: Array,
    ids_N: Array,
    lse_N: Array,
    ent_N: Array,
    g: tuple[Array, Array],
    temperature: float,
    rows: int,
) -> Array:
    """dlogits [N, V] in the logits' dtype, recomputed chunk by chunk from the saved statistics."""
    glogp_N, gent_N = (x.astype(jnp.float32) for x in g)

    def body(start: Array, c: int, dz_NV: Array) -> Array:
        def sl(a: Array) -> Array:
            return lax.dynamic_slice_in_dim(a, start, c)

        s_cV = st.scaled(sl(z_NV), temperature)
        ds_cV = st.dscaled(s_cV, sl(ids_N), sl(lse_N), sl(ent_N), sl(glogp_N), sl(gent_N))
        return lax.dynamic_update_slice_in_dim(dz_NV, (ds_cV / temperature).astype(z_NV.dtype), start, 0)

    return row_loop(z_NV.shape[0], rows, body, jnp.zeros_like(z_NV))


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _logprob_entropy(z_NV: Array, ids_N: Array, temperature: float, rows: int) -> tuple[Array, Array]:
    lse, ent, chosen = forward_stats(z_NV, ids_N, temperature, rows)
    return chosen - lse, ent


def _fwd(z_NV: Array, ids_N: Array, temperature: float, rows: int) -> tuple[tuple[Array, Array], tuple]:
    lse, ent, chosen = forward_stats(z_NV, ids_N, temperature, rows)
    return (chosen - lse, ent), (z_NV, ids_N, lse, ent)


def _bwd(temperature: float, rows: int, res: tuple, g: tuple[Array, Array]) -> tuple[Array, None]:
    z_NV, ids_N, lse, ent = res
    return backward_dlogits(z_NV, ids_N, lse, ent, g, temperature, rows), None


_logprob_entropy.defvjp(_fwd, _bwd)


def token_logprob_entropy(
    logits_BTV: Array, ids_BT: Array, *, temperature: float = 1.0, blocks: BlockSizes | None = None
) -> tuple[Array, Array]:
    """log p(ids) and entropy of softmax(logits / temperature), float32 [B, T]; memory O(rows x V)."""
    *lead, v = logits_BTV.shape
    rows = (blocks or for_device("chunked")).rows
    logp_N, ent_N = _logprob_entropy(
        logits_BTV.reshape(-1, v), ids_BT.reshape(-1).astype(jnp.int32), float(temperature), rows
    )
    return logp_N.reshape(lead), ent_N.reshape(lead)
