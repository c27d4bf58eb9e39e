"""The decode's attention over its KV cache as one Pallas GPU (Triton) kernel: `rollout.attention_impl: pallas`.

One decode position: each row's queries [N, H] against this layer's cache slots [0, window), read in place from
the stacked cache [L, B, S, K, H] (no copy of the window: XLA's einsums over a sliced window make XLA:GPU copy
the slice before each matmul), with an online softmax in registers (no float32 scores in HBM) and the float32
output normalised at the end. One program per (row, kv head): its G = N / K query heads, padded to 16 rows for
the tensor cores, against `block` slots at a time. With `samples` > 1 the rows come in groups sharing a prompt
(`sampler._prefill`): the first `prompt` slots are read from the group's first row (as `attend_shared_prompt`
reads them once per group; the group's programs read the same blocks, which L2 may serve), the rest from the
row's own.

Same numbers as `attention.attend` / `attend_shared_prompt` within bfloat16 rounding: the scores and softmax
in float32, probabilities rounded to the values' dtype before their matmul (unnormalised here, in [0, 1]).
Off a GPU (and for no GPU compile target) it runs in Pallas interpret mode: the CPU tests. Under a mesh in
context it runs per device (`jax.shard_map`) with the cache's own layout (`sharding.cache_spec`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array, lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec as P

from trainer.kernels.logprob.blocks import on_gpu
from trainer.kernels.sharded import active_mesh
from trainer.sharding import cache_spec

BLOCKS = (128, 64, 32, 16)  # slots per step of the kernel's loop: the largest that divides both parts
_ROWS = 16  # the tensor cores' smallest M: a kv head's G query heads are padded to it
_NEG = -1e30  # a masked slot's score (attention._NEG's role; finite so a masked block cannot make NaNs)
_INT32 = 2**31  # a cache buffer's elements stay below this: a guard against 32-bit address arithmetic


def plan(prompt: int, window: int, slots: int) -> tuple[int, int] | None:
    """(block, span): the kernel reads slots [0, span), span = `window` rounded up to whole blocks after the
    `prompt` (the extra slots are unwritten and masked; the decode's last window, P + C - 1, ends one short of the
    cache's `slots`), with the largest block that divides the prompt and rounds the window no further than the
    smallest would; None when no block fits the cache."""
    if prompt % BLOCKS[-1]:
        return None
    span = prompt + -(-(window - prompt) // BLOCKS[-1]) * BLOCKS[-1]
    if span > slots:
        return None
    return next((b, span) for b in BLOCKS if prompt % b == 0 and (span - prompt) % b == 0)


def unsupported(
    shape_LBSKH: tuple[int, ...], heads: int, prompt: int, window: int, samples: int
) -> str | None:
    """Why the kernel cannot attend over this cache (its shape, N query heads, the parts), or None when it can."""
    L, B, S, K, H = shape_LBSKH
    if H & (H - 1) or H < 16:
        return f"the head dim must be a power of two >= 16, received {H}"
    if heads % K or heads // K > _ROWS:
        return f"each kv head may have at most {_ROWS} query heads, received {heads} heads over {K}"
    if L * B * S * K * H >= _INT32:
        return f"the cache must have fewer than 2**31 elements per buffer, received {L * B * S * K * H:,}"
    if B % samples:
        return f"the rows ({B}) must be whole groups of {samples} samples"
    if plan(prompt, window, S) is None:
        return (
            f"the prompt slots ({prompt}) must be a multiple of {BLOCKS[-1]} and the window ({window} slots) fit "
            f"in the {S}-slot cache once rounded up to one (prompt buckets and max_new_tokens that are multiples "
            f"of {BLOCKS[-1]} always do)"
        )
    return None


def shared_prompt(prompt: int, window: int, samples: int) -> int:
    """The slots read from each group's first row: `prompt` when rows come in groups and the window reaches
    past the prompt (as Attention reads them with `attend_shared_prompt`), else 0 (every slot from its own row)."""
    return prompt if samples > 1 and 0 < prompt < window else 0


def _kernel(
    layer_ref: Any, q_ref: Any, k_ref: Any, v_ref: Any, mask_ref: Any, o_ref: Any,
    *, prompt: int, window: int, samples: int, block: int,
) -> None:  # fmt: skip
    b, kh = pl.program_id(0), pl.program_id(1)
    layer = layer_ref[0]
    q = q_ref[b, kh, :, :]  # [16, H]: the kv head's query heads, zero rows after them
    H = q.shape[-1]
    scale = 1.0 / float(H) ** 0.5
    Carry = tuple[Array, Array, Array]  # the output [16, H], the running max and sum [16], float32

    def part(row: Array, first: int, count: int, carry: Carry) -> Carry:
        def body(i: Array, c: Carry) -> Carry:
            acc, run_max, run_sum = c
            at = pl.ds(pl.multiple_of((first + i) * block, block), block)
            k = k_ref[layer, row, at, kh, :]  # [block, H]
            s = plgpu.dot(q, k.T) * scale  # [16, block] float32
            s = jnp.where(mask_ref[b, at][None, :] != 0, s, _NEG)
            new_max = jnp.maximum(run_max, s.max(axis=1))
            fix = jnp.exp(run_max - new_max)
            p = jnp.exp(s - new_max[:, None])
            v = v_ref[layer, row, at, kh, :]
            acc = acc * fix[:, None] + plgpu.dot(p.astype(v.dtype), v)
            return acc, new_max, run_sum * fix + p.sum(axis=1)

        return lax.fori_loop(0, count, body, carry) if count else carry

    zeros = jnp.zeros((_ROWS,), jnp.float32)
    carry = (jnp.zeros((_ROWS, H), jnp.float32), zeros + _NEG, zeros)
    # the group's prompt from its first row, then the row's own completion slots
    carry = part((b // samples) * samples, 0, prompt // block, carry)
    acc, _, total = part(b, prompt // block, (window - prompt) // block, carry)
    o_ref[b, kh, :, :] = (acc / total[:, None]).astype(o_ref.dtype)


def _local(
    q_BNH: Array, keys_LBSKH: Array, values_LBSKH: Array, layer: Array, mask_BS: Array,
    *, prompt: int, window: int, samples: int, interpret: bool,
) -> Array:  # fmt: skip
    _, B, S, K, H = keys_LBSKH.shape
    N = q_BNH.shape[1]
    G = N // K
    why = unsupported(keys_LBSKH.shape, N, prompt, window, samples)  # this device's part of the cache
    if why:
        raise ValueError(
            f"rollout.attention_impl=pallas: {why}; rollout.attention_impl=xla attends over any shape"
        )
    block, span = plan(prompt, window, S) or (0, 0)
    q_BKRH = jnp.pad(
        q_BNH.reshape(B, K, G, H).astype(keys_LBSKH.dtype), ((0, 0), (0, 0), (0, _ROWS - G), (0, 0))
    )
    kernel = functools.partial(_kernel, prompt=prompt, window=span, samples=samples, block=block)
    out_BKRH = pl.pallas_call(
        kernel,
        grid=(B, K),
        out_shape=jax.ShapeDtypeStruct((B, K, _ROWS, H), keys_LBSKH.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        interpret=interpret,
        name="decode_attention",
    )(
        jnp.reshape(layer, (1,)).astype(jnp.int32),
        q_BKRH,
        keys_LBSKH,
        values_LBSKH,
        mask_BS[:, :span].astype(jnp.int32),
    )
    return out_BKRH[:, :, :G].reshape(B, N, H).astype(q_BNH.dtype)


def decode_attention(
    q_BTNH: Array, keys_LBSKH: Array, values_LBSKH: Array, layer: Array, mask_BTS: Array,
    *, prompt: int, window: int, samples: int,
) -> Array:  # fmt: skip
    """One position's attention [B, 1, N, H] over layer `layer`'s cache slots [0, window) (0: all S), the first
    `prompt` from each group of `samples` rows' first row when `shared_prompt` says so; `mask_BTS` [B, 1, S]
    marks the written slots (the kernel may read a few past the window: `plan`). A shape the kernel cannot take
    (`unsupported`, per device) is a ValueError naming it."""
    T = q_BTNH.shape[1]
    if T != 1:
        raise ValueError(f"the decode attention kernel takes one position per row, received {T}")
    window = window or keys_LBSKH.shape[2]
    prompt = shared_prompt(prompt, window, samples)
    # Under a jit of its own: flax's nn.scan (the scan layer loop) traces its body once for the broadcast values
    # and drops what they do not use; flax 0.12.12 (not 0.12.8) refuses a bare pallas_call it could not drop as a
    # data dependency on the scan's body, and jit's DCE drops the call whole.
    local = jax.jit(
        functools.partial(_local, prompt=prompt, window=window, samples=samples, interpret=not on_gpu())
    )
    q_BNH, mask_BS = q_BTNH[:, 0], mask_BTS[:, 0]
    mesh = active_mesh()
    if mesh is None:
        return local(q_BNH, keys_LBSKH, values_LBSKH, layer, mask_BS)[:, None]
    # Per device with the cache's layout: rows over the batch axes (and tp when tp does not split the kv heads),
    # kv heads over tp where it splits them; a query head's kv head, and a row's group, on its device.
    spec = P(*cache_spec(keys_LBSKH.shape, mesh), *[None] * 5)[:5]
    rows, heads = spec[1], spec[3]
    out = jax.shard_map(
        local, mesh=mesh, in_specs=(P(rows, heads, None), P(*spec), P(*spec), P(), P(rows, None)),
        out_specs=P(rows, heads, None), check_vma=False,
    )(q_BNH, keys_LBSKH, values_LBSKH, layer, mask_BS)  # fmt: skip
    return out[:, None]
