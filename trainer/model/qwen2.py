"""The Qwen2 decoder as Flax linen modules, exposed through pure functions over a plain params dict.

Dims: B batch, T query tokens, S key slots (T itself, or the KV cache length), D hidden, N query heads,
K key/value heads, G = N // K query heads per KV head, H head dim, F MLP width, V vocab, L layers.

Public API (params is the dict under linen's "params" collection):
  init_params(config, rng) -> params
  forward_hidden(params, config, input_ids_BT, positions_BT, attention_mask_BT) -> hidden_BTD
  lm_head_weight(params, config) -> W_DV          (the embedding transposed when tied)
  forward_logits(params, config, input_ids_BT, positions_BT, attention_mask_BT) -> logits_BTV
  forward_with_kv(...)  prefill: hidden plus every layer's fresh keys/values ([L, B, T, K, H] each)
  decode_step(...)      one token per sequence against the stacked KV cache (trainer/sampling/kv_cache.py)
  decode_step_layers(...)  the same with the layers unrolled over per-layer weights and caches (unstack_layers)
The decoder layers run as one scan over stacked parameters (params["layers"], a leading [L] axis on every
layer parameter): one compiled layer body, whatever the depth. trainer/model/params.py maps the stack to
Hugging Face's per-layer tensors.
Attention scores and softmax are always float32; q/k/v and probs@v run in the compute dtype.
The forward functions are jitted with `config` static (inlined when called inside another jit).
Activations are constrained by logical axis names at every layer boundary (trainer.sharding.constrain: a
no-op without a mesh in context); `config.remat` rematerialises each decoder layer in the backward pass.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from trainer.model.config import Qwen2Config
from trainer.model.flash import attend_flash
from trainer.sharding import (
    constrain,
    constrain_cache,
    constrain_sequences,
    heads_split,
    lookup_layout,
    path_str,
)

Params = dict[str, Any]
# Logical axis names of the activations (trainer.sharding.LOGICAL maps them to mesh axes).
_BTD = ("batch", "length", "embed")
_BTNH = ("batch", "length", "heads", "head_dim")
_BTKH = ("batch", "length", "kv_heads", "head_dim")
_BTF = ("batch", "length", "mlp")
_NEG = -1e30  # finite "minus infinity": a fully masked row (left padding) softmaxes to uniform, not NaN


def _dt(name: str) -> jnp.dtype:
    return jnp.dtype(name)


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


def _apply_rope(x_BTnH: Array, cos_BTH: Array, sin_BTH: Array) -> Array:
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


class RMSNorm(nn.Module):
    eps: float
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x_BTD: Array) -> Array:
        scale = self.param("scale", nn.initializers.ones, (x_BTD.shape[-1],), self.param_dtype)
        x = x_BTD.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return (scale.astype(jnp.float32) * x).astype(self.dtype)


class Attention(nn.Module):
    config: Qwen2Config

    def _dense(self, features: int, bias: bool, name: str) -> nn.Dense:
        c = self.config
        init = nn.initializers.normal(c.initializer_range)
        # Non-zero bias init so that tests exercise the q/k/v biases (HF initialises them to zero).
        return nn.Dense(
            features, use_bias=bias, dtype=_dt(c.dtype), param_dtype=_dt(c.param_dtype),
            kernel_init=init, bias_init=init, name=name,
        )  # fmt: skip

    @nn.compact
    def __call__(self, x_BTD: Array, cos_BTH: Array, sin_BTH: Array, mask_BTS: Array, kv: Any) -> Any:
        """`kv` None: attend over this call's own keys (mask_BTS is [B, T, T]; or the attention mask [B, T], which
        selects the Pallas kernel: `self_mask`) and return them; else
        (keys_LBSKH, values_LBSKH, layer, slot, window, prompt, samples): write the new keys/values at (`layer`,
        `slot`) of the whole stacked cache, in place, attend over this layer's first `window` slots (0: all S;
        mask_BTS is [B, T, S]) and return the updated stacked cache. With `samples` G > 1 the rows come in groups
        of G samples of one prompt whose first `prompt` slots are the same in each group (the prefill wrote them
        so): those are read from each group's first row only (`attend_shared_prompt`)."""
        c = self.config
        B, T, _ = x_BTD.shape
        N, K, H = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q = constrain(self._dense(N * H, True, "q_proj")(x_BTD).reshape(B, T, N, H), *_BTNH)
        k = constrain(self._dense(K * H, True, "k_proj")(x_BTD).reshape(B, T, K, H), *_BTKH)
        v = constrain(self._dense(K * H, True, "v_proj")(x_BTD).reshape(B, T, K, H), *_BTKH)
        mesh = jax.sharding.get_abstract_mesh()
        by_sequence = kv is not None and not mesh.empty and not heads_split(K, mesh)
        if by_sequence:
            # The cache is split by sequence over tp too (trainer.sharding.heads_split): each device attends
            # for its own sequences with every head. The queries cross tp by one all-to-all in their own dtype,
            # before RoPE (after it, XLA moved them as two float32 halves of RoPE's rotation); the output by one.
            q = constrain_sequences(q)
        q, k = _apply_rope(q, cos_BTH, sin_BTH), _apply_rope(k, cos_BTH, sin_BTH)
        out: Array | None = None  # the decode's attention over a shared prompt, else computed below
        if kv is None:
            keys, values, new_kv = k, v, (k, v)
        else:
            # One small in-place update of the stacked cache per layer and decode step (the cache is the
            # layer loop's carry, so XLA updates its buffer in place), then this layer's slots are read.
            keys_LBSKH, values_LBSKH, layer, slot, window, prompt, samples = kv
            at = (jnp.asarray(layer, jnp.int32), jnp.int32(0), jnp.asarray(slot, jnp.int32), jnp.int32(0),
                  jnp.int32(0))  # fmt: skip
            keys_LBSKH = jax.lax.dynamic_update_slice(keys_LBSKH, k[None].astype(keys_LBSKH.dtype), at)
            values_LBSKH = jax.lax.dynamic_update_slice(values_LBSKH, v[None].astype(values_LBSKH.dtype), at)
            # This layer's first `window` slots (0: all), read by one dynamic slice of the stack: only the slots
            # this position can see (the rest are not written yet) leave HBM. (Slicing the window out of the
            # whole layer row instead made XLA copy the row first: the same bytes as no window.)
            size = (1, *keys_LBSKH.shape[1:2], window or keys_LBSKH.shape[2], *keys_LBSKH.shape[3:])
            row = (at[0], *at[1:2], jnp.int32(0), *at[3:])  # (layer, 0, 0, 0, 0)
            mask_BTS = mask_BTS[..., : size[2]]
            new_kv = (constrain_cache(keys_LBSKH), constrain_cache(values_LBSKH))
            if samples > 1 and 0 < prompt < size[2]:  # each group's prompt slots read once
                parts = (*_group_prompt(keys_LBSKH, values_LBSKH, at[0], prompt, samples),
                         *_completion(keys_LBSKH, values_LBSKH, at[0], prompt, size[2]))  # fmt: skip
                kp, vp, kc, vc = (x.astype(q.dtype) for x in parts)
                out = attend_shared_prompt(q, kp, vp, kc, vc, mask_BTS)
            else:
                keys = jax.lax.dynamic_slice(keys_LBSKH, row, size)[0]
                values = jax.lax.dynamic_slice(values_LBSKH, row, size)[0]
        if out is None and kv is None and mask_BTS.ndim == 2:  # the [B, T] attention mask: the Pallas kernel
            out = attend_flash(q, keys, values, mask_BTS)
        elif out is None:
            out = attend(q, keys.astype(q.dtype), values.astype(q.dtype), mask_BTS)
        out = constrain(constrain_sequences(out) if by_sequence else out, *_BTNH)
        return constrain(self._dense(c.hidden_size, False, "o_proj")(out.reshape(B, T, N * H)), *_BTD), new_kv


def _group_prompt(
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


def _completion(
    keys_LBSKH: Array, values_LBSKH: Array, layer: Array, prompt: int, window: int
) -> list[Array]:
    """Layer `layer`'s slots [prompt, window) of every row: [B, window - prompt, K, H] keys and values."""
    _, B, _, K, H = keys_LBSKH.shape
    at = (layer, jnp.int32(0), jnp.int32(prompt), jnp.int32(0), jnp.int32(0))
    return [
        jax.lax.dynamic_slice(x, at, (1, B, window - prompt, K, H))[0] for x in (keys_LBSKH, values_LBSKH)
    ]


class MLP(nn.Module):
    config: Qwen2Config

    @nn.compact
    def __call__(self, x_BTD: Array) -> Array:
        c = self.config
        kw: dict[str, Any] = {
            "use_bias": False,
            "dtype": _dt(c.dtype),
            "param_dtype": _dt(c.param_dtype),
            "kernel_init": nn.initializers.normal(c.initializer_range),
        }
        x_BTD = constrain(x_BTD, "group_rows", "length", "embed")  # trainer.sharding.LOGICAL
        gate = constrain(nn.Dense(c.intermediate_size, name="gate_proj", **kw)(x_BTD), *_BTF)
        up = constrain(nn.Dense(c.intermediate_size, name="up_proj", **kw)(x_BTD), *_BTF)
        return constrain(nn.Dense(c.hidden_size, name="down_proj", **kw)(nn.silu(gate) * up), *_BTD)


class DecoderLayer(nn.Module):
    """One decoder layer as the body of the layer scan: (carry, layer index, broadcast inputs) -> (carry, out).

    Without a cache (`slot` None) the carry is the hidden state and the output this layer's (k, v) when
    `collect_kv`, else None. With one, the carry is (hidden, keys_LBSKH, values_LBSKH) and the output None."""

    config: Qwen2Config
    collect_kv: bool = False
    window: int = 0  # decode: attend over the first `window` cache slots (0: all)
    prompt: int = 0  # decode: the cache's first `prompt` slots, the same in each group of `samples` rows
    samples: int = 1

    @nn.compact
    def __call__(
        self, carry: Any, layer: Array, cos_BTH: Array, sin_BTH: Array, mask_BTS: Array, slot: Array | None
    ) -> Any:
        c = self.config
        if slot is None:
            x_BTD, kv = carry, None
        else:
            x_BTD, keys_LBSKH, values_LBSKH = carry
            kv = (keys_LBSKH, values_LBSKH, layer, slot, self.window, self.prompt, self.samples)
        norm: dict[str, Any] = {
            "eps": c.rms_norm_eps,
            "dtype": _dt(c.dtype),
            "param_dtype": _dt(c.param_dtype),
        }
        h = RMSNorm(name="input_layernorm", **norm)(x_BTD)
        attn_out, new_kv = Attention(c, name="self_attn")(h, cos_BTH, sin_BTH, mask_BTS, kv)
        x_BTD = x_BTD + attn_out
        h = RMSNorm(name="post_attention_layernorm", **norm)(x_BTD)
        x_BTD = constrain(x_BTD + MLP(c, name="mlp")(h), *_BTD)
        if slot is None:
            return x_BTD, (new_kv if self.collect_kv else None)
        return (x_BTD, *new_kv), None


# What each decoder layer keeps for the backward pass (config.remat): everything, only matmul outputs, or
# only its input (the layer is recomputed).
REMAT_POLICIES: dict[str, Any] = {
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}


class Qwen2(nn.Module):
    """Embedding -> L decoder layers -> final RMSNorm.

    The layers are one `nn.scan` over a stacked copy of their parameters (every layer parameter has a
    leading [L] axis, under params["layers"]): XLA compiles one layer body whatever the depth, so a 36-layer
    model compiles as fast as a 2-layer one. Returns (hidden_BTD, (keys_LBTKH, values_LBTKH)) with
    `collect_kv` (the prefill), (hidden_BTD, None) without it, and with a cache (hidden_BTD, (keys, values))
    with the stacked [L, B, S, K, H] cache updated."""

    config: Qwen2Config
    collect_kv: bool = False
    window: int = 0  # decode: attend over the first `window` cache slots (0: all)
    prompt: int = 0  # decode: the cache's first `prompt` slots, the same in each group of `samples` rows
    samples: int = 1

    def setup(self) -> None:
        c = self.config
        self.embed_tokens = nn.Embed(
            c.vocab_size, c.hidden_size, dtype=_dt(c.dtype), param_dtype=_dt(c.param_dtype),
            embedding_init=nn.initializers.normal(c.initializer_range),
        )  # fmt: skip
        layer_cls = DecoderLayer
        if c.remat != "none":  # inside a scan the loop already keeps XLA from merging recomputations away
            layer_cls = nn.remat(DecoderLayer, policy=REMAT_POLICIES[c.remat], prevent_cse=False)
        self.layers = nn.scan(
            layer_cls, variable_axes={"params": 0}, split_rngs={"params": True},
            in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast), length=c.num_hidden_layers,
        )(c, self.collect_kv, self.window, self.prompt, self.samples, name="layers")  # fmt: skip
        self.norm = RMSNorm(c.rms_norm_eps, _dt(c.dtype), _dt(c.param_dtype))
        if not c.tie_word_embeddings:
            self.lm_head = nn.Dense(
                c.vocab_size, use_bias=False, dtype=_dt(c.dtype), param_dtype=_dt(c.param_dtype),
                kernel_init=nn.initializers.normal(c.initializer_range),
            )  # fmt: skip

    def __call__(self, input_ids_BT: Array, positions_BT: Array, mask_BTS: Array, cache: Any = None) -> Any:
        table_VD = lookup_layout(self.embed_tokens.embedding).astype(_dt(self.config.dtype))
        x_BTD = constrain(jnp.take(table_VD, input_ids_BT, axis=0), *_BTD)  # nn.Embed's lookup
        cos, sin = rope_cos_sin(positions_BT, self.config)
        layer_L = jnp.arange(self.config.num_hidden_layers, dtype=jnp.int32)
        if cache is None:  # prefill / training
            x_BTD, kv = self.layers(x_BTD, layer_L, cos, sin, mask_BTS, None)
            return self.norm(x_BTD), kv
        keys, values, slot = cache  # decode: the stacked cache is the layer loop's carry
        (x_BTD, keys, values), _ = self.layers((x_BTD, keys, values), layer_L, cos, sin, mask_BTS, slot)
        return self.norm(x_BTD), (keys, values)

    def init_all(self, input_ids_BT: Array) -> Any:
        """Touches every parameter (the untied lm_head included) for `init`."""
        T = input_ids_BT.shape[1]
        positions = jnp.broadcast_to(jnp.arange(T), input_ids_BT.shape)
        hidden, _ = self(input_ids_BT, positions, jnp.ones((1, T, T), bool))
        return self.lm_head(hidden) if not self.config.tie_word_embeddings else hidden


def init_params(config: Qwen2Config, rng: Array) -> Params:
    """Random parameters (normal(initializer_range) weights, zero biases, unit norms) in param_dtype."""
    ids = jnp.zeros((1, 2), jnp.int32)
    # Shapes from linen, values from NumPy seeded by `rng`: jitting linen's init costs ~7 s of XLA compile
    # on CPU for the 151,936-row vocabulary; NumPy draws the same sizes in a fraction of a second.
    shapes = jax.eval_shape(lambda: Qwen2(config).init(rng, ids, method=Qwen2.init_all)["params"])
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    host = {path_str(kp): np.empty(leaf.shape, np.float32) for kp, leaf in leaves}
    gen = np.random.default_rng(np.asarray(jax.random.key_data(rng)).ravel().tolist())
    # Drawn per tensor in the order of the per-layer names ("layers_0/...", "layers_1/...", sorted as
    # strings): the same seed gives the same model as before the layers were stacked.
    per_layer: list[tuple[str, str, int | None]] = [
        (f"layers_{i}/{path[len('layers/'):]}", path, i) for path in host if path.startswith("layers/")
        for i in range(config.num_hidden_layers)]  # fmt: skip
    whole: list[tuple[str, str, int | None]] = [
        (path, path, None) for path in host if not path.startswith("layers/")
    ]
    draws = sorted(whole + per_layer, key=lambda d: d[0])
    for _, path, i in draws:
        target = host[path] if i is None else host[path][i]
        if path.endswith("/scale"):
            target[...] = 1.0
        else:
            target[...] = gen.standard_normal(target.shape, dtype=np.float32) * np.float32(
                config.initializer_range
            )
    values = [jnp.asarray(host[path_str(kp)], leaf.dtype) for kp, leaf in leaves]
    return jax.tree_util.tree_unflatten(treedef, values)


def causal_mask(attention_mask_BT: Array) -> Array:
    """[B, T, T]: query t sees key s iff s <= t and key s is a real token."""
    T = attention_mask_BT.shape[1]
    tril_TT = jnp.tril(jnp.ones((T, T), bool))
    return tril_TT[None] & attention_mask_BT.astype(bool)[:, None, :]


def self_mask(config: Qwen2Config, attention_mask_BT: Array) -> Array:
    """What the layers of a forward without a cache take: the [B, T, T] causal mask (xla), or the [B, T]
    attention mask itself (pallas: the kernel is causal and reads padding as segment ids)."""
    if config.attention == "pallas":
        return attention_mask_BT.astype(jnp.int32)
    return causal_mask(attention_mask_BT)


@functools.partial(jax.jit, static_argnames="config")
def forward_hidden(
    params: Params, config: Qwen2Config, input_ids_BT: Array, positions_BT: Array, attention_mask_BT: Array
) -> Array:
    """Final-normed hidden states [B, T, D] in the compute dtype (causal, padding keys masked)."""
    hidden, _ = Qwen2(config).apply(
        {"params": params}, input_ids_BT, positions_BT, self_mask(config, attention_mask_BT)
    )
    return hidden


@functools.partial(jax.jit, static_argnames="config")
def forward_with_kv(
    params: Params, config: Qwen2Config, input_ids_BT: Array, positions_BT: Array, attention_mask_BT: Array
) -> tuple[Array, tuple[Array, Array]]:
    """Like forward_hidden, plus every layer's keys and values after RoPE (k_LBTKH, v_LBTKH): the prefill."""
    out = Qwen2(config, collect_kv=True).apply(
        {"params": params}, input_ids_BT, positions_BT, self_mask(config, attention_mask_BT)
    )
    return cast(tuple[Array, tuple[Array, Array]], out)  # apply() is typed loosely: (hidden, (k, v))


def lm_head_weight(params: Params, config: Qwen2Config) -> Array:
    """The output projection W [D, V] (the embedding transposed when tied), in param_dtype."""
    if config.tie_word_embeddings:
        return params["embed_tokens"]["embedding"].T
    return params["lm_head"]["kernel"]


@functools.partial(jax.jit, static_argnames="config")
def logits_from_hidden(params: Params, config: Qwen2Config, hidden_BTD: Array) -> Array:
    w_DV = lm_head_weight(params, config).astype(_dt(config.dtype))
    hidden_BTD = constrain(hidden_BTD, "group_rows", "length", "embed")  # trainer.sharding.LOGICAL
    logits_BTV = jnp.einsum("btd,dv->btv", hidden_BTD, w_DV, preferred_element_type=jnp.float32)
    # Split over the vocabulary like W: left free, a consumer that wants whole rows (the sampler's draw) made
    # XLA all-gather W itself (3B: the 0.6 GB tied embedding, for every decoded token) instead of the logits.
    return constrain(logits_BTV, "batch", "length", "vocab")


@functools.partial(jax.jit, static_argnames="config")
def forward_logits(
    params: Params, config: Qwen2Config, input_ids_BT: Array, positions_BT: Array, attention_mask_BT: Array
) -> Array:
    """Logits [B, T, V], float32 (matmul in the compute dtype, float32 accumulation)."""
    hidden_BTD = forward_hidden(params, config, input_ids_BT, positions_BT, attention_mask_BT)
    return logits_from_hidden(params, config, hidden_BTD)


@functools.partial(jax.jit, static_argnames=("config", "window", "prompt", "samples"))
def decode_step(
    params: Params,
    config: Qwen2Config,
    input_ids_BT: Array,
    positions_BT: Array,
    keys_LBSKH: Array,
    values_LBSKH: Array,
    slot: Array,
    slot_mask_BTS: Array,
    window: int = 0,
    prompt: int = 0,
    samples: int = 1,
) -> tuple[Array, Array, Array]:
    """Write the new tokens' keys/values at cache `slot` of every layer and attend over the cache's first
    `window` slots (0: all; `slot` must be below it). With `samples` G > 1: the rows come in groups of G whose
    first `prompt` cache slots are the same (one prompt's, `sampler._prefill`), read once per group.

    Returns (logits_BTV float32, keys, values) with the cache updated."""
    out = Qwen2(config, window=window, prompt=prompt, samples=samples).apply(
        {"params": params}, input_ids_BT, positions_BT, slot_mask_BTS, (keys_LBSKH, values_LBSKH, slot)
    )
    hidden, (keys, values) = cast(tuple[Array, tuple[Array, Array]], out)  # apply() is typed loosely
    return logits_from_hidden(params, config, hidden), keys, values


def unstack_layers(params: Params) -> Params:
    """`params` with the layer stack as a tuple of per-layer trees (`params["layers"][l]`): what
    `decode_step_layers` takes. One copy of the layers' weights, made once per rollout."""
    stack = params["layers"]
    L = jax.tree_util.tree_leaves(stack)[0].shape[0]
    return {**params, "layers": tuple(jax.tree_util.tree_map(lambda x, i=i: x[i], stack) for i in range(L))}


def decode_step_layers(
    params: Params,
    config: Qwen2Config,
    input_ids_BT: Array,
    positions_BT: Array,
    caches: tuple[tuple[Array, Array], ...],
    slot: Array,
    slot_mask_BTS: Array,
    window: int = 0,
    prompt: int = 0,
    samples: int = 1,
) -> tuple[Array, tuple[tuple[Array, Array], ...]]:
    """`decode_step` with the layers unrolled: `params` from `unstack_layers`, `caches` one (keys, values) pair
    [1, B, S, K, H] per layer. The same arithmetic layer for layer; each layer's matmuls and attention read its
    own weight and cache buffers. (Inside the layer scan XLA:GPU copies each layer's weights and cache row out of
    the stacks before using them, every position: docs/performance.md, "Where a GPU decode's time goes".)

    Returns (logits_BTV float32, caches) with each layer's cache updated in place."""
    c = config
    table_VD = lookup_layout(params["embed_tokens"]["embedding"]).astype(_dt(c.dtype))
    x_BTD = constrain(jnp.take(table_VD, input_ids_BT, axis=0), *_BTD)
    cos, sin = rope_cos_sin(positions_BT, c)
    layer = DecoderLayer(c, window=window, prompt=prompt, samples=samples)
    new: list[tuple[Array, Array]] = []
    for p_l, kv_l in zip(params["layers"], caches, strict=True):
        (x_BTD, *kv), _ = layer.apply(
            {"params": p_l}, (x_BTD, *kv_l), jnp.int32(0), cos, sin, slot_mask_BTS, slot
        )
        new.append((kv[0], kv[1]))  # this layer's [1, B, S, K, H] keys and values, updated at `slot`
    norm = RMSNorm(c.rms_norm_eps, _dt(c.dtype), _dt(c.param_dtype))
    hidden_BTD = norm.apply({"params": params["norm"]}, x_BTD)
    return logits_from_hidden(params, c, hidden_BTD), tuple(new)
