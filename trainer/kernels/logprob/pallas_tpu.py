"""Log-prob and entropy as two Pallas TPU kernels: a vocab-tiled forward with running statistics in VMEM
scratch, and a backward that writes dlogits tile by tile (optionally over the logits buffer).

Dims: N rows (flattened B x T), V vocab. Grid (N / rows, ceil(V / vocab)); the last vocab tile is ragged
and masked (151936 = 128 x 1187 has no other 128-multiple divisor). Off TPU the kernels run in Pallas
interpret mode, which is how the CPU tests exercise them. Sharded batches go through `shard_map`
(`sharded`): each device runs the kernels on its own rows.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from trainer.kernels.logprob import softmax_stats as st
from trainer.kernels.logprob.blocks import BlockSizes, device_kind, for_device


def _interpret() -> bool:
    """Interpret mode everywhere but on a TPU (or when compiling ahead of time for one)."""
    return not device_kind().lower().startswith("tpu")


def _check(z_NV: Array, ids_N: Array, blocks: BlockSizes) -> None:
    blocks.check_dtype(z_NV.dtype)
    if z_NV.ndim != 2 or ids_N.shape != z_NV.shape[:1]:
        raise ValueError(f"expected logits [N, V] and ids [N], received {z_NV.shape} and {ids_N.shape}")
    if z_NV.shape[0] % blocks.rows:
        raise ValueError(f"rows N={z_NV.shape[0]} must be a multiple of BlockSizes.rows={blocks.rows}")


def _fwd_kernel(z_ref, ids_ref, lse_ref, ent_ref, ch_ref, m_sc, l_sc, b_sc, c_sc, *, v, bv, temperature):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init() -> None:
        m_sc[...] = jnp.full(m_sc.shape, st.NEG, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        b_sc[...] = jnp.zeros(b_sc.shape, jnp.float32)
        c_sc[...] = jnp.zeros(c_sc.shape, jnp.float32)

    s = st.scaled(z_ref[...], temperature)
    cols = j * bv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    valid = cols < v
    s = jnp.where(valid, s, st.NEG)  # the ragged tile's tail holds whatever was in memory
    m_t = jnp.max(s, axis=1, keepdims=True)
    d = s - m_t
    e = jnp.where(valid, jnp.exp(d), 0.0)
    tile = (m_t, jnp.sum(e, axis=1, keepdims=True), jnp.sum(e * d, axis=1, keepdims=True))
    m, s1, b = st.merge((m_sc[...], l_sc[...], b_sc[...]), tile)
    m_sc[...], l_sc[...], b_sc[...] = m, s1, b
    c_sc[...] += jnp.sum(jnp.where(cols == ids_ref[...], s, 0.0), axis=1, keepdims=True)

    @pl.when(j == pl.num_programs(1) - 1)
    def _done() -> None:
        lse, ent = st.finish(m_sc[...], l_sc[...], b_sc[...])
        lse_ref[...], ent_ref[...], ch_ref[...] = lse, ent, c_sc[...]


def _bwd_kernel(z_ref, ids_ref, lse_ref, ent_ref, gl_ref, ge_ref, dz_ref, *, bv, temperature):
    j = pl.program_id(1)
    s = st.scaled(z_ref[...], temperature)
    # Ragged columns compute garbage, but Pallas drops out-of-bounds writes of the last tile.
    ds = st.dscaled_cols(s, ids_ref[...], lse_ref[...], ent_ref[...], gl_ref[...], ge_ref[...], col0=j * bv)
    dz_ref[...] = (ds * (1.0 / temperature)).astype(dz_ref.dtype)


def _specs(blocks: BlockSizes, v: int) -> tuple[tuple[int, int], pl.BlockSpec, pl.BlockSpec]:
    grid = (0, pl.cdiv(v, blocks.vocab))
    tile = pl.BlockSpec((blocks.rows, blocks.vocab), lambda i, j: (i, j))
    row = pl.BlockSpec((blocks.rows, 1), lambda i, j: (i, 0))
    return grid, tile, row


def forward_stats(z_NV: Array, ids_N: Array, temperature: float, blocks: BlockSizes) -> tuple[Array, ...]:
    """(lse, entropy, chosen scaled logit), float32 [N]."""
    _check(z_NV, ids_N, blocks)
    (n, v), r = z_NV.shape, blocks.rows
    (_, nv), tile, row = _specs(blocks, v)
    col = jax.ShapeDtypeStruct((n, 1), jnp.float32)
    outs = pl.pallas_call(
        partial(_fwd_kernel, v=v, bv=blocks.vocab, temperature=temperature),
        grid=(n // r, nv),
        in_specs=[tile, row],
        out_specs=[row, row, row],
        out_shape=[col, col, col],
        scratch_shapes=[pltpu.VMEM((r, 1), jnp.float32) for _ in range(4)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=_interpret(),
    )(z_NV, ids_N[:, None])
    return tuple(o[:, 0] for o in outs)


def backward_dlogits(
    z_NV: Array, ids_N: Array, lse_N: Array, ent_N: Array, g: tuple[Array, Array], temperature: float,
    blocks: BlockSizes, alias: bool = False,
) -> Array:  # fmt: skip
    """dlogits [N, V] in the logits' dtype; `alias` writes it over the logits buffer (input_output_aliases)."""
    (n, v), r = z_NV.shape, blocks.rows
    (_, nv), tile, row = _specs(blocks, v)
    rows = [ids_N[:, None], lse_N[:, None], ent_N[:, None]] + [x.astype(jnp.float32)[:, None] for x in g]
    return pl.pallas_call(
        partial(_bwd_kernel, bv=blocks.vocab, temperature=temperature),
        grid=(n // r, nv),
        in_specs=[tile] + [row] * 5,
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct(z_NV.shape, z_NV.dtype),
        input_output_aliases={0: 0} if alias else {},
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=_interpret(),
    )(z_NV, *rows)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _pallas(
    z_NV: Array, ids_N: Array, temperature: float, blocks: BlockSizes, alias: bool
) -> tuple[Array, Array]:
    lse, ent, chosen = forward_stats(z_NV, ids_N, temperature, blocks)
    return chosen - lse, ent


def _fwd(z_NV: Array, ids_N: Array, temperature: float, blocks: BlockSizes, alias: bool) -> tuple:
    lse, ent, chosen = forward_stats(z_NV, ids_N, temperature, blocks)
    return (chosen - lse, ent), (z_NV, ids_N, lse, ent)


def _bwd(temperature: float, blocks: BlockSizes, alias: bool, res: tuple, g: tuple[Array, Array]) -> tuple:
    z_NV, ids_N, lse, ent = res
    return backward_dlogits(z_NV, ids_N, lse, ent, g, temperature, blocks, alias), None


_pallas.defvjp(_fwd, _bwd)


def token_logprob_entropy(
    logits_BTV: Array, ids_BT: Array, *, temperature: float = 1.0, blocks: BlockSizes | None = None,
    alias_dlogits: bool = False,
) -> tuple[Array, Array]:  # fmt: skip
    """log p(ids) and entropy of softmax(logits / temperature), float32 [B, T]."""
    *lead, v = logits_BTV.shape
    blocks = blocks or for_device("pallas")
    z_NV, ids_N = logits_BTV.reshape(-1, v), ids_BT.reshape(-1).astype(jnp.int32)
    n = z_NV.shape[0]
    pad = -n % blocks.rows
    if pad:  # a copy of the logits: callers on the hot path keep B x T a multiple of rows
        z_NV, ids_N = jnp.pad(z_NV, ((0, pad), (0, 0))), jnp.pad(ids_N, (0, pad))
    logp_N, ent_N = _pallas(z_NV, ids_N, float(temperature), blocks, alias_dlogits)
    return logp_N[:n].reshape(lead), ent_N[:n].reshape(lead)


def sharded(
    mesh: jax.sharding.Mesh, batch_axes: str | tuple[str, ...], **kwargs: Any
) -> Callable[[Array, Array], tuple[Array, Array]]:
    """`token_logprob_entropy` over a batch sharded on `batch_axes` of `mesh`: per-device kernels via shard_map."""
    spec = jax.sharding.PartitionSpec(batch_axes)

    def local(logits_BTV: Array, ids_BT: Array) -> tuple[Array, Array]:
        return token_logprob_entropy(logits_BTV, ids_BT, **kwargs)

    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec), out_specs=(spec, spec), check_vma=False)
