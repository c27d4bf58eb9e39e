"""The decode step with the layers unrolled over per-layer weights and caches (the sampler's `unrolled` layer
loop): the same arithmetic as qwen2.decode_step, layer for layer."""

from __future__ import annotations

from typing import cast

import jax
import jax.numpy as jnp
from jax import Array

from trainer.model import fusion
from trainer.model.attention import rope_cos_sin
from trainer.model.config import Qwen2Config
from trainer.model.layers import BTD, RMSNorm, dt
from trainer.model.qwen2 import DecoderLayer, Params, decode_logits
from trainer.sharding import constrain, lookup_layout


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
    table_VD = lookup_layout(params["embed_tokens"]["embedding"]).astype(dt(c.dtype))
    x_BTD = constrain(jnp.take(table_VD, input_ids_BT, axis=0), *BTD)
    cos, sin = rope_cos_sin(positions_BT, c)
    layer = DecoderLayer(c, window=window, prompt=prompt, samples=samples, fused=fusion.is_fused(params))
    new: list[tuple[Array, Array]] = []
    for p_l, kv_l in zip(params["layers"], caches, strict=True):
        (x_BTD, *kv), _ = layer.apply(
            {"params": p_l}, (x_BTD, *kv_l), jnp.int32(0), cos, sin, slot_mask_BTS, slot
        )
        new.append((kv[0], kv[1]))  # this layer's [1, B, S, K, H] keys and values, updated at `slot`
    norm = RMSNorm(c.rms_norm_eps, dt(c.dtype), dt(c.param_dtype))
    hidden_BTD = cast(Array, norm.apply({"params": params["norm"]}, x_BTD))
    return decode_logits(params, c, hidden_BTD), tuple(new)
