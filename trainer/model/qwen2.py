"""The Qwen2 decoder as Flax linen modules, exposed through pure functions over a plain params dict.

Dims: B batch, T query tokens, S key slots (T itself, or the KV cache length), D hidden, N query heads,
K key/value heads, G = N // K query heads per KV head, H head dim, F MLP width, V vocab, L layers.

Public API (params is the dict under linen's "params" collection):
  init_params(config, rng) -> params
  forward_hidden(params, config, input_ids_BT, positions_BT, attention_mask_BT) -> hidden_BTD
  forward_hidden_grouped(...)  the same for completions in groups of one prompt, each prompt run once
  lm_head_weight(params, config) -> W_DV          (the embedding transposed when tied)
  forward_logits(params, config, input_ids_BT, positions_BT, attention_mask_BT) -> logits_BTV
  forward_with_kv(...)  prefill: hidden plus every layer's fresh keys/values ([L, B, T, K, H] each)
  decode_step(...)      one token per sequence against the stacked KV cache (trainer/sampling/kv_cache.py)
  (trainer/model/unrolled.py: decode_step_layers, the same with the layers unrolled over per-layer weights)
Two layouts of the weights, picked from the params tree (fusion.is_fused): HF's separate q/k/v and gate/up
(training), or each fused into one matmul (the decode's copy, trainer.layout.decode_layout; model/fusion.py).
The layer's parts (RMSNorm, Attention, MLP) are trainer/model/layers.py. The decoder layers run as one scan
over stacked parameters (params["layers"], a leading [L] axis on every layer parameter): one compiled layer
body, whatever the depth. trainer/model/params.py maps the stack to Hugging Face's per-layer tensors.
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
from jax.sharding import PartitionSpec as P

from trainer.model import fusion
from trainer.model.attention import rope_cos_sin
from trainer.model.config import Qwen2Config
from trainer.model.layers import BTD, MLP, MLP_UP, Attention, RMSNorm, dt, residual_rows
from trainer.sharding import constrain, logical_spec, lookup_layout, path_str, vocab_axes, vocab_ways

Params = dict[str, Any]


class DecoderLayer(nn.Module):
    """One decoder layer as the body of the layer scan: (carry, layer index, broadcast inputs) -> (carry, out).

    Without a cache (`slot` None) the carry is the hidden state and the output this layer's (k, v) when
    `collect_kv`, else None. With one, the carry is (hidden, keys_LBSKH, values_LBSKH) and the output None."""

    config: Qwen2Config
    collect_kv: bool = False
    window: int = 0  # decode: attend over the first `window` cache slots (0: all)
    prompt: int = 0  # decode: the cache's first `prompt` slots, the same in each group of `samples` rows
    samples: int = 1
    fused: bool = False  # the fused projections of the decode layout (trainer/model/fusion.py)

    @nn.compact
    def __call__(
        self, carry: Any, layer: Array, cos_BTH: Array, sin_BTH: Array, mask_BTS: Any, slot: Array | None
    ) -> Any:
        c = self.config
        if slot is None:
            x_BTD, kv = carry, None
        else:
            x_BTD, keys_LBSKH, values_LBSKH = carry
            kv = (keys_LBSKH, values_LBSKH, layer, slot, self.window, self.prompt, self.samples)
        norm: dict[str, Any] = {"eps": c.rms_norm_eps, "dtype": dt(c.dtype), "param_dtype": dt(c.param_dtype)}
        h = RMSNorm(name="input_layernorm", **norm)(x_BTD)
        attn_out, new_kv = Attention(c, self.fused, name="self_attn")(h, cos_BTH, sin_BTH, mask_BTS, kv)
        rows = residual_rows()
        x_BTD = constrain(x_BTD + attn_out, *rows)
        h = RMSNorm(name="post_attention_layernorm", **norm)(x_BTD)
        x_BTD = constrain(x_BTD + MLP(c, self.fused, name="mlp")(h, rows), *rows)
        if slot is None:
            return x_BTD, (new_kv if self.collect_kv else None)
        return (x_BTD, *new_kv), None


# What each decoder layer keeps for the backward pass (config.remat): everything, only matmul outputs, only the
# MLP's up projection (the largest single saving of recomputation after the matmuls: its [T, F] output; the gate,
# the attention and their inputs are recomputed), or only its input (the layer is recomputed).
REMAT_POLICIES: dict[str, Any] = {
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    MLP_UP: jax.checkpoint_policies.save_only_these_names(MLP_UP),
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
    fused: bool = False  # the fused projections of the decode layout (trainer/model/fusion.py)

    def setup(self) -> None:
        c = self.config
        self.embed_tokens = nn.Embed(
            c.vocab_size, c.hidden_size, dtype=dt(c.dtype), param_dtype=dt(c.param_dtype),
            embedding_init=nn.initializers.normal(c.initializer_range),
        )  # fmt: skip
        layer_cls = DecoderLayer
        if c.remat != "none":  # inside a scan the loop already keeps XLA from merging recomputations away
            layer_cls = nn.remat(DecoderLayer, policy=REMAT_POLICIES[c.remat], prevent_cse=False)
        self.layers = nn.scan(
            layer_cls, variable_axes={"params": 0}, split_rngs={"params": True},
            in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast), length=c.num_hidden_layers,
        )(c, self.collect_kv, self.window, self.prompt, self.samples, self.fused, name="layers")  # fmt: skip
        self.norm = RMSNorm(c.rms_norm_eps, dt(c.dtype), dt(c.param_dtype))
        if not c.tie_word_embeddings:
            self.lm_head = nn.Dense(
                c.vocab_size, use_bias=False, dtype=dt(c.dtype), param_dtype=dt(c.param_dtype),
                kernel_init=nn.initializers.normal(c.initializer_range),
            )  # fmt: skip

    def __call__(self, input_ids_BT: Array, positions_BT: Array, mask_BTS: Any, cache: Any = None) -> Any:
        table_VD = lookup_layout(self.embed_tokens.embedding).astype(dt(self.config.dtype))
        x_BTD = constrain(jnp.take(table_VD, input_ids_BT, axis=0), *BTD)  # nn.Embed's lookup
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
    hidden, _ = Qwen2(config, fused=fusion.is_fused(params)).apply(
        {"params": params}, input_ids_BT, positions_BT, self_mask(config, attention_mask_BT)
    )
    return hidden


@functools.partial(jax.jit, static_argnames="config")
def forward_hidden_grouped(
    params: Params, config: Qwen2Config, prompt_ids_UP: Array, prompt_positions_UP: Array,
    prompt_mask_UP: Array, ids_BC: Array, positions_BC: Array, mask_BC: Array,
) -> tuple[Array, Array]:  # fmt: skip
    """forward_hidden of B = U x G rows [prompt, completion] whose rows come in groups of G samples of one prompt
    (rows u*G .. u*G + G - 1 hold prompt u), each prompt run once: the layers see one row per group, [its prompt,
    its G completions] (P + G x C tokens: every weight in one matmul per layer, the rows split over devices as
    the groups are), and the attention splits it again (layers.attend_grouped): the prompt attends over itself,
    each completion over its group's prompt, then its own tokens, causally. Returns (prompt hidden [U, P, D],
    completion hidden [B, C, D]): the hidden states forward_hidden gives those positions of the whole rows, at
    1 / G of the prompts' FLOPs and activations (the update's completion log-probs: trainer.loop.programs)."""
    (U, P), (B, C) = prompt_ids_UP.shape, ids_BC.shape
    if B % U:
        raise ValueError(f"the {B} completion rows must come in groups over the {U} prompts")

    def packed(prompt_UP: Array, rows_BC: Array) -> Array:
        return jnp.concatenate([prompt_UP, rows_BC.reshape(U, B // U * C)], axis=1)

    if config.attention == "pallas":  # the kernel reads the [B, T] masks as segment ids
        masks = (
            prompt_mask_UP.astype(jnp.int32),
            prompt_mask_UP.astype(jnp.int32),
            mask_BC.astype(jnp.int32),
        )
    else:
        over_prompt_BCP = jnp.repeat(prompt_mask_UP.astype(bool), B // U, axis=0)[:, None, :]
        over_prompt_BCP = jnp.broadcast_to(over_prompt_BCP, (B, C, P))
        completion_BCS = jnp.concatenate([over_prompt_BCP, causal_mask(mask_BC)], axis=-1)
        masks = (prompt_mask_UP, causal_mask(prompt_mask_UP), completion_BCS)
    hidden_UTD, _ = Qwen2(config, fused=fusion.is_fused(params)).apply(
        {"params": params}, packed(prompt_ids_UP, ids_BC), packed(prompt_positions_UP, positions_BC), masks
    )
    return hidden_UTD[:, :P], hidden_UTD[:, P:].reshape(B, C, -1)


@functools.partial(jax.jit, static_argnames="config")
def forward_with_kv(
    params: Params, config: Qwen2Config, input_ids_BT: Array, positions_BT: Array, attention_mask_BT: Array
) -> tuple[Array, tuple[Array, Array]]:
    """Like forward_hidden, plus every layer's keys and values after RoPE (k_LBTKH, v_LBTKH): the prefill."""
    out = Qwen2(config, collect_kv=True, fused=fusion.is_fused(params)).apply(
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
    w_DV = lm_head_weight(params, config).astype(dt(config.dtype))
    hidden_BTD = constrain(hidden_BTD, "group_rows", "length", "embed")  # trainer.sharding.LOGICAL
    logits_BTV = jnp.einsum("btd,dv->btv", hidden_BTD, w_DV, preferred_element_type=jnp.float32)
    # Split over the vocabulary like W: left free, a consumer that wants whole rows (the sampler's draw) made
    # XLA all-gather W itself (3B: the 0.6 GB tied embedding, for every decoded token) instead of the logits.
    return constrain(logits_BTV, "batch", "length", "vocab")


def decode_logits(params: Params, config: Qwen2Config, hidden_BTD: Array) -> Array:
    """The decode's logits [B, T, V] float32: the vocabulary over a slice's every device and the rows whole
    (trainer.sharding's `slice_vocab`, `slice_rows`). Each device multiplies by a half of its tp-group block of W
    (the dp'th half), so a dp group's devices no longer each read the same block for their own rows: the LM
    head's bytes per token halve (3B on a v6e-8: 156 -> 78 MB a device) for a gather of the last hidden rows and
    a draw over twice the blocks. A shard_map: W stays in its tp-group layout, which the token lookup reads
    (left to XLA, the decode loop carried W split over the slice and all-gathered it over dp for every lookup)."""
    w_DV = lm_head_weight(params, config).astype(dt(config.dtype))
    mesh = jax.sharding.get_abstract_mesh()
    V = w_DV.shape[1]
    if mesh.empty or vocab_ways(V, mesh, "slice_vocab") == vocab_ways(V, mesh):
        return logits_from_hidden(params, config, hidden_BTD)
    B, T, _ = hidden_BTD.shape
    out = logical_spec(
        ("slice_rows", "length", "slice_vocab"), (B, T, V), mesh
    )  # the vocabulary: (tp group, dp)

    def local(h_BTD: Array, w_Dv: Array) -> Array:
        half = w_Dv.shape[1] // mesh.shape["dp"]
        w_Dv = jax.lax.dynamic_slice_in_dim(w_Dv, jax.lax.axis_index("dp") * half, half, axis=1)
        return jnp.einsum("btd,dv->btv", h_BTD, w_Dv, preferred_element_type=jnp.float32)

    return jax.shard_map(
        local, in_specs=(P(out[0]), P(None, vocab_axes(V, mesh))), out_specs=out, check_vma=False
    )(hidden_BTD, w_DV)


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
    out = Qwen2(config, window=window, prompt=prompt, samples=samples, fused=fusion.is_fused(params)).apply(
        {"params": params}, input_ids_BT, positions_BT, slot_mask_BTS, (keys_LBSKH, values_LBSKH, slot)
    )
    hidden, (keys, values) = cast(tuple[Array, tuple[Array, Array]], out)  # apply() is typed loosely
    return decode_logits(params, config, hidden), keys, values
