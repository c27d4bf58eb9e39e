"""The decode layout's fused q|k|v and gate|up projections against Hugging Face's separate ones (the training
layout) on the same weights: the forward's logits, the KV-cache decode step, the gradients and generated tokens,
in float32 and in bfloat16 compute; and `layout.decode_layout`'s fused copy on an 8-device decode mesh."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from trainer import layout, sharding
from trainer.model import fusion, qwen2
from trainer.sampling import kv_cache
from trainer.sampling.sampler import SamplingConfig, generate
from trainer.sharding import path_str

# Per compute dtype: the largest logit difference allowed between the two layouts (logits of magnitude ~1-4).
# float32: summation order only; bfloat16: a rounding or two of an 8-bit mantissa where XLA fuses differently.
TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2}


def _flat(tree: Any) -> dict[str, np.ndarray]:
    return {path_str(kp): np.asarray(v) for kp, v in jax.tree_util.tree_leaves_with_path(tree)}


def _fused(params: Any, config: qwen2.Qwen2Config) -> Any:
    return fusion.fuse_tree(params, config.num_key_value_heads)


def _inputs(B: int = 3, T: int = 9) -> tuple[jax.Array, jax.Array, jax.Array]:
    ids = np.random.default_rng(11).integers(0, 151_665, size=(B, T)).astype(np.int32)
    mask = np.ones((B, T), np.int32)
    mask[1, :4] = 0  # left padding
    pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(mask)


def test_fuse_and_unfuse_are_inverse_and_keep_hf_head_order(tiny_f32: tuple[Any, ...]) -> None:
    config, params = tiny_f32
    N, K, H = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    fused = fusion.fuse_tree(params, K)
    flat, separate = _flat(fused), _flat(params)
    assert "layers/self_attn/qkv_proj/kernel" in flat and "layers/self_attn/q_proj/kernel" not in flat
    L, D, G = config.num_hidden_layers, config.hidden_size, N // K
    assert flat["layers/self_attn/qkv_proj/kernel"].shape == (L, D, K, G + 2, H)
    assert flat["layers/self_attn/qkv_proj/bias"].shape == (L, K, G + 2, H)
    assert flat["layers/mlp/gate_up_proj/kernel"].shape == (L, D, 2, config.intermediate_size)
    assert fusion.is_fused(fused) and not fusion.is_fused(params)
    again = _flat(fusion.unfuse_tree(fused))
    assert again.keys() == separate.keys() and all(np.array_equal(again[k], separate[k]) for k in separate)
    # Query head n = k * G + g sits with kv head k: the fused [.., K, G + 2, H] read back in HF's column order.
    qkv = flat["layers/self_attn/qkv_proj/kernel"]
    np.testing.assert_array_equal(
        qkv[..., :G, :].reshape(L, D, N * H), separate["layers/self_attn/q_proj/kernel"]
    )
    np.testing.assert_array_equal(
        qkv[..., G, :].reshape(L, D, K * H), separate["layers/self_attn/k_proj/kernel"]
    )
    gate_up = flat["layers/mlp/gate_up_proj/kernel"]
    np.testing.assert_array_equal(gate_up[:, :, 1], separate["layers/mlp/up_proj/kernel"])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_logits_equal_the_separate_projections(tiny_f32: tuple[Any, ...], dtype: str) -> None:
    config, params = tiny_f32
    config = config.replace(dtype=dtype)
    ids, pos, mask = _inputs()
    fused = np.asarray(qwen2.forward_logits(_fused(params, config), config, ids, pos, mask))
    separate = np.asarray(qwen2.forward_logits(params, config, ids, pos, mask))
    real = np.asarray(mask, bool)
    assert np.abs(separate[real]).max() > 0.5  # not a comparison of near-zero logits
    diff = np.abs(fused[real] - separate[real]).max()
    assert diff <= TOLERANCE[dtype], f"{dtype}: max abs logit difference {diff}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_step_equals_the_separate_projections(
    tiny_f32: tuple[Any, ...], prompts: tuple[Any, ...], dtype: str
) -> None:
    """Prefill and one decode step with the fused weights: the same logits and the same keys and values in the
    same cache slots as with the separate ones."""
    config, params = tiny_f32
    config = config.replace(dtype=dtype)
    prompt_ids, prompt_mask = (jnp.asarray(x) for x in prompts)
    B, P = prompt_ids.shape
    pos = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
    new_B1 = jnp.asarray(np.random.default_rng(5).integers(0, 151_665, size=(B, 1)), jnp.int32)
    out = []
    for p in (_fused(params, config), params):
        _, kv = qwen2.forward_with_kv(p, config, prompt_ids, pos, prompt_mask)
        cache = kv_cache.mark_written(kv_cache.from_prefill(kv, prompt_mask, P + 3))
        logits, keys, values = qwen2.decode_step(
            p,
            config,
            new_B1,
            pos[:, -1:] + 1,
            cache.keys,
            cache.values,
            cache.index,
            cache.mask_BS[:, None, :],
        )
        out.append([np.asarray(x, np.float32) for x in (logits, keys, values)])
    (fused, fused_k, fused_v), (separate, separate_k, separate_v) = out
    assert np.abs(separate).max() > 0.5
    diff = np.abs(fused - separate).max()
    assert diff <= TOLERANCE[dtype], f"{dtype}: max abs logit difference {diff}"
    np.testing.assert_allclose(fused_k, separate_k, atol=TOLERANCE[dtype], rtol=0)
    np.testing.assert_allclose(fused_v, separate_v, atol=TOLERANCE[dtype], rtol=0)


def test_gradients_equal_the_separate_projections_fused(tiny_f32: tuple[Any, ...]) -> None:
    """The gradient of a token log-likelihood with respect to the fused weights is the separate weights'
    gradient in the fused layout (float32 compute: summation order only)."""
    config, params = tiny_f32
    ids, pos, mask = _inputs()

    def loss(p: Any) -> jax.Array:
        logq = jax.nn.log_softmax(qwen2.forward_logits(p, config, ids, pos, mask)[:, :-1], axis=-1)
        return -(jnp.take_along_axis(logq, ids[:, 1:, None], axis=-1)[..., 0] * mask[:, 1:]).sum()

    fused_grads = jax.jit(jax.grad(loss))(_fused(params, config))
    separate_grads = jax.jit(jax.grad(loss))(params)
    got, want = _flat(fused_grads), _flat(_fused(separate_grads, config))
    assert got.keys() == want.keys()
    for name in got:
        scale = np.abs(want[name]).max()
        assert scale > 0, name  # every weight gets a gradient
        np.testing.assert_allclose(got[name], want[name], atol=1e-5 * max(1.0, scale), rtol=0, err_msg=name)


def test_decode_layout_fuses_and_splits_by_kv_head_and_mlp_column(
    tiny_f32: tuple[Any, ...], prompts: tuple[Any, ...]
) -> None:
    """`decode_layout`'s copy on a decode mesh of 8 CPU devices (tp 2 over the 2 kv heads): fused, each device's
    block of q|k|v one kv head's query heads, key and value, its block of gate|up matching columns of both; the
    rollout's tokens from it (scan and unrolled layer loops) are the separate weights' tokens."""
    config, params = tiny_f32
    mesh = sharding.make_mesh(1, 8, 1)
    rmesh, to_decode = layout.decode_layout(mesh, config, params, 2)
    rparams = to_decode(sharding.shard_params(params, mesh))
    host = _flat(_fused(jax.tree_util.tree_map(lambda x: x.astype(config.dtype), params), config))
    qkv = rparams["layers"]["self_attn"]["qkv_proj"]["kernel"]
    gate_up = rparams["layers"]["mlp"]["gate_up_proj"]["kernel"]
    assert qkv.sharding.is_equivalent_to(NamedSharding(rmesh, P(None, None, "tp", None, None)), 5)
    assert gate_up.sharding.is_equivalent_to(NamedSharding(rmesh, P(None, None, None, "tp")), 4)
    for path, leaf in jax.tree_util.tree_leaves_with_path(rparams):
        for shard in leaf.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), host[path_str(path)][shard.index])
    assert {int(shard.data.shape[2]) for shard in qkv.addressable_shards} == {1}  # one kv head a device

    ids, mask = (jnp.asarray(x) for x in prompts)
    batch = sharding.batch_sharding(rmesh, ids.shape)
    ids_s, mask_s = jax.device_put(ids, batch), jax.device_put(mask, batch)
    want = generate(
        params, config, ids, mask, jax.random.key(0), SamplingConfig(5, greedy=True), (-1,), 151_643
    )
    for layers in ("scan", "unrolled"):
        sampling = SamplingConfig(5, greedy=True, layers=layers)
        got = generate(
            rparams, config, ids_s, mask_s, jax.random.key(0), sampling, (-1,), 151_643, mesh=rmesh
        )
        np.testing.assert_array_equal(np.asarray(got.completion_ids_BC), np.asarray(want.completion_ids_BC))
