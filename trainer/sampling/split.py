"""The draw where the logits are: a token from logits whose vocabulary stays split in blocks over the tp group, with
one all-gather of per-block figures and one sum across the group per position (Dims: B batch, V vocab, K blocks,
n = V / K their width, k the blocks a device holds, S the figures per block).

Each block's figures are local: its maximum and mass of the temperature-scaled logits, its largest raw logit and
where. Every device gathers the [B, K, S] figures of all blocks and computes the same normaliser and the same block
the draw falls in; the device holding that block finds the token in it, and one sum across the group hands every
device the token and its log-probability. Written as a shard_map so that XLA's partitioner keeps it at these two
collectives (left to partition `jnp` over a split vocabulary, it made seven a position: 0.027 s of the 3B seed's
decode bound on a v6e-8 against 0.008 s now, docs/performance.md). Without a mesh the same code runs on K local
blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import Array
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from trainer import sharding
from trainer.sampling.tokens import SamplingConfig, sample_token

# Logits' logical names (trainer.sharding.LOGICAL): rows over the batch and the vocabulary over the tp group; or,
# the decode's (qwen2.decode_logits), the vocabulary over a slice's every device and the rows whole within it.
BV = ("batch", "vocab")
SLICE_BV = ("slice_rows", "slice_vocab")


def sample(
    logits_BV: Array, rng: Array, sampling: SamplingConfig, mesh: Mesh | None, names: tuple[str, str] = BV
) -> tuple[Array, Array]:
    """sample_token on whole rows, or, with the vocabulary split over the tp group and no top-k/top-p filter,
    where the logits are (`sample_split`): no all-gather of the float32 logits (3B: 19 MB per token over ICI).
    `names`: the logits' logical (rows, vocabulary) names (the decode's: `SLICE_BV`)."""
    parts = 1 if mesh is None else sharding.vocab_ways(logits_BV.shape[-1], mesh, names[1])
    if parts > 1 and sampling.top_k == 0 and sampling.top_p == 1.0:
        return sample_split(logits_BV, rng, sampling, parts, mesh, names)
    return sample_token(_whole_rows(logits_BV, mesh), rng, sampling)


def _whole_rows(logits_BV: Array, mesh: Mesh | None) -> Array:
    """Logits with the vocabulary on one device per row (batch still split): the draw's cumsum over a
    vocabulary split over tp would be a chain of cross-device permutes per token (minutes on 8 CPU devices)."""
    if mesh is None:
        return logits_BV
    return jax.lax.with_sharding_constraint(logits_BV, sharding.batch_sharding(mesh, logits_BV.shape))


def sample_split(
    logits_BV: Array, rng: Array, sampling: SamplingConfig, parts: int, mesh: Mesh | None = None,
    names: tuple[str, str] = BV,
) -> tuple[Array, Array]:  # fmt: skip
    """sample_token (no top-k/top-p) computed on `parts` vocabulary blocks that stay where they are (under `mesh`,
    split over its tp group as the logits are). The same draw: the token whose cumulative probability first exceeds
    u x the total (a block's offset is the mass of the blocks before it), greedy the first maximum, the log-prob
    from the temperature-scaled log-softmax."""
    B, V = logits_BV.shape
    n = V // parts
    u_B = jax.random.uniform(rng, (B, 1))[:, 0]
    if mesh is None:
        return _draw(logits_BV.reshape(B, parts, n), u_B, jnp.arange(parts), sampling, lambda f: f,
                     lambda x: jnp.sum(x, axis=1))  # fmt: skip
    spec = sharding.logical_spec(names, (B, V), mesh)
    rows, vocab = spec[0], sharding.vocab_axes(V, mesh, names[1])

    def local(logits_Bv: Array, u_B: Array) -> tuple[Array, Array]:
        block_k = jax.lax.axis_index(vocab)[None]
        return _draw(logits_Bv.reshape(logits_Bv.shape[0], 1, n), u_B, block_k, sampling,
                     lambda f: jax.lax.all_gather(f[:, 0], vocab, axis=1),
                     lambda x: jax.lax.psum(x[:, 0], vocab))  # fmt: skip

    return jax.shard_map(local, mesh=mesh, in_specs=(spec, P(rows)), out_specs=(P(rows), P(rows)),
                         check_vma=False)(logits_BV, u_B)  # fmt: skip


def _draw(
    raw_Bkn: Array, u_B: Array, block_k: Array, sampling: SamplingConfig,
    gather: Callable[[Array], Array], total: Callable[[Array], Array],
) -> tuple[Array, Array]:  # fmt: skip
    """The draw on this device's k blocks (global indices `block_k`): `gather` turns their [B, k, S] figures into
    every block's [B, K, S]; `total` sums [B, k, 2] over every block of every device into [B, 2]."""
    n = raw_Bkn.shape[-1]
    x_Bkn = raw_Bkn.astype(jnp.float32) / sampling.temperature
    m_Bk = jnp.max(x_Bkn, axis=-1)
    figures_BkS = jnp.stack([
        m_Bk, jnp.sum(jnp.exp(x_Bkn - m_Bk[..., None]), axis=-1),
        jnp.max(raw_Bkn, axis=-1).astype(jnp.float32), jnp.argmax(raw_Bkn, axis=-1).astype(jnp.float32),
    ], axis=-1)  # fmt: skip
    m_BK, s_BK, best_BK, at_BK = jnp.moveaxis(gather(figures_BkS), -1, 0)
    top_B = jnp.max(m_BK, axis=-1)
    mass_BK = s_BK * jnp.exp(m_BK - top_B[:, None])
    log_z_B = top_B + jnp.log(jnp.sum(mass_BK, axis=-1))
    logq_Bkn = x_Bkn - log_z_B[:, None, None]
    if sampling.greedy:  # the first block holding the maximum, its first maximum: argmax's first index
        block_B = jnp.argmax(best_BK, axis=-1)
        j_Bk = jnp.broadcast_to(jnp.take_along_axis(at_BK, block_B[:, None], axis=-1).astype(jnp.int32),
                                m_Bk.shape)  # fmt: skip
    else:  # the block whose cumulative mass first exceeds u x the total, then the token inside it
        p_BK = mass_BK / jnp.sum(mass_BK, axis=-1, keepdims=True)
        ends_BK = jnp.cumsum(p_BK, axis=-1)
        u_B1 = u_B[:, None] * ends_BK[:, -1:]
        block_B = jnp.minimum(jnp.sum(ends_BK <= u_B1, axis=-1), p_BK.shape[-1] - 1)
        starts_Bk = jnp.take_along_axis(ends_BK - p_BK, jnp.broadcast_to(block_k, m_Bk.shape), axis=-1)
        cdf_Bkn = jnp.cumsum(jnp.exp(logq_Bkn), axis=-1) + starts_Bk[..., None]
        j_Bk = jnp.minimum(jnp.sum(cdf_Bkn <= u_B1[..., None], axis=-1), n - 1)
    mine_Bk = block_k[None, :] == block_B[:, None]
    logq_Bk = jnp.take_along_axis(logq_Bkn, j_Bk[..., None], axis=-1)[..., 0]
    token_Bk = (block_k[None, :] * n + j_Bk).astype(jnp.float32)  # exact: V < 2**24
    picked_B2 = total(jnp.where(mine_Bk[..., None], jnp.stack([token_Bk, logq_Bk], axis=-1), 0.0))
    return picked_B2[:, 0].astype(jnp.int32), picked_B2[:, 1]
