"""Attention's pure pieces: rotary position embeddings, attention over given keys and values (the full
scores, or a group's shared prompt once beside each row's completion), and the KV cache's slices they read.
Dims as trainer/model/qwen2.py's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array

from trainer.model.config import Qwen2Config

_NEG = -1e30  # finite "minus infinity": a fully masked row (left padding) softmaxes to uniform, not NaN


def rope_cos_sin(positions_BT: Array, config: Qwen2Config) -> tuple[Array, Array]:
    """HF-layout RoPE tables [B, T, H] in float32 (frequencies repeated over both halves)."""
    H = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, H, 2, dtype=jnp.float32) / H))
    pos = positions_BT.astype(jnp.float32)
    if config.rope_type == "linear":
        pos = pos / config.rope_factor
    freqs_BTh = pos[..., None] * inv_freq
    emb_BTH = jnp.concatenate([freqs_BTh, freqs_BTh], axis=-1)
    return jnp.cos(emb_BTH), jnp.sin(emb_BTH)


def apply_rope(x_BTnH: Array, cos_BTH: Array, sin_BTH: Array) -> Array:
    """HF's `x * cos + rotate_half(x) * sin` in float32, written half by half: the same float32 operations (so
    the same bits), but XLA fuses them into one pass in the input's dtype. Written as one float32 array and its
    rotated copy, it wrote both in float32 and changed their layout twice before the attention kernel: 1.6 GB
    of HBM a layer for q in the seed's update (docs/performance.md)."""
    half = x_BTnH.shape[-1] // 2
    x1, x2 = x_BTnH[..., :half].astype(jnp.float32), x_BTnH[..., half:].astype(jnp.float32)
    cos1, cos2 = cos_BTH[:, :, None, :half], cos_BTH[:, :, None, half:]
    sin1, sin2 = sin_BTH[:, :, None, :half], sin_BTH[:, :, None, half:]
    out1, out2 = x1 * cos1 + (-x2) * sin1, x2 * cos2 + x1 * sin2
    return jnp.concatenate([out1.astype(x_BTnH.dtype), out2.astype(x_BTnH.dtype)], axis=-1)


def attend(q_BTNH: Array, k_BSKH: Array, v_BSKH: Array, mask_BTS: Array) -> Array:
    """Grouped-query attention: float32 scores and softmax, probs@v in the inputs' dtype -> [B, T, N, H]."""
    B, T, N, H = q_BTNH.shape
    K = k_BSKH.shape[2]
    q_BTKGH = q_BTNH.reshape(B, T, K, N // K, H)
    scores_BKGTS = jnp.einsum(
        "btkgh,bskh->bkgts", q_BTKGH, k_BSKH, preferred_element_type=jnp.float32
    ) / jnp.sqrt(jnp.float32(H))
    scores_BKGTS = jnp.where(mask_BTS[:, None, None, :, :], scores_BKGTS, _NEG)
    probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(v_BSKH.dtype)
    out_BTKGH = jnp.einsum("bkgts,bskh->btkgh", probs_BKGTS, v_BSKH, preferred_element_type=jnp.float32)
    return out_BTKGH.reshape(B, T, N, H).astype(q_BTNH.dtype)


def attend_shared_prompt(
    q_BTNH: Array, kp_UPKH: Array, vp_UPKH: Array, kc_BWKH: Array, vc_BWKH: Array, mask_BTS: Array
) -> Array:
    """`attend` over [prompt slots, completion slots] when the B = U x G rows come in groups of G samples of one
    prompt (rows u*G .. u*G + G - 1): the prompt's keys/values once per group [U, P, K, H], the completion's per
    row [B, W, K, H]. The same scores, the same softmax over their concatenation (slot order as in the cache),
    and probs @ v as the sum of the two parts; each group's prompt slots leave HBM once, not G times (cascade
    attention over a shared prefix)."""
    B, T, N, H = q_BTNH.shape
    U, P, K, _ = kp_UPKH.shape
    G, g = B // U, N // K
    f32, scale = {"preferred_element_type": jnp.float32}, jnp.sqrt(jnp.float32(H))
    q_UETKgH, q_BTKgH = q_BTNH.reshape(U, G, T, K, g, H), q_BTNH.reshape(B, T, K, g, H)
    prompt_BKGTP = jnp.einsum("uetkgh,upkh->uekgtp", q_UETKgH, kp_UPKH, **f32).reshape(B, K, g, T, P)
    own_BKGTW = jnp.einsum("btkgh,bskh->bkgts", q_BTKgH, kc_BWKH, **f32)
    scores_BKGTS = jnp.concatenate([prompt_BKGTP, own_BKGTW], axis=-1) / scale
    scores_BKGTS = jnp.where(mask_BTS[:, None, None, :, :], scores_BKGTS, _NEG)
    probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(vc_BWKH.dtype)
    probs_UEKGTP = probs_BKGTS[..., :P].reshape(U, G, K, g, T, P)
    out_BTKGH = jnp.einsum("uekgtp,upkh->uetkgh", probs_UEKGTP, vp_UPKH, **f32).reshape(B, T, K, g, H)
    out_BTKGH = out_BTKGH + jnp.einsum("bkgts,bskh->btkgh", probs_BKGTS[..., P:], vc_BWKH, **f32)
    return out_BTKGH.reshape(B, T, N, H).astype(q_BTNH.dtype)


def group_prompt(
    keys_LBSKH: Array, values_LBSKH: Array, layer: Array, prompt: int, samples: int
) -> list[Array]:
    """Layer `layer`'s first `prompt` slots of each group's first row: [U, P, K, H] keys and values (the stack's
    rows seen as [U, G]: a view, so only U of the B rows are read)."""
    L, B, S, K, H = keys_LBSKH.shape
    U = B // samples
    at = (layer, jnp.int32(0), jnp.int32(0), jnp.int32(0), jnp.int32(0), jnp.int32(0))
    return [
        jax.lax.dynamic_slice(x.reshape(L, U, samples, S, K, H), at, (1, U, 1, prompt, K, H))[0, :, 0]
        for x in (keys_LBSKH, values_LBSKH)
    ]


def completion_slots(
    keys_LBSKH: Array, values_LBSKH: Array, layer: Array, prompt: int, window: int
) -> list[Array]:
    """Layer `layer`'s slots [prompt, window) of every row: [B, window - prompt, K, H] keys and values."""
    _, B, _, K, H = keys_LBSKH.shape
    at = (layer, jnp.int32(0), jnp.int32(prompt), jnp.int32(0), jnp.int32(0))
    return [
        jax.lax.dynamic_slice(x, at, (1, B, window - prompt, K, H))[0] for x in (keys_LBSKH, values_LBSKH)
    ]
