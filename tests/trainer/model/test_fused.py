"""The fused q|k|v and gate|up projections against Hugging Face's separate ones on the same weights: the
forward's logits, the KV-cache decode step and the gradients, in float32 and in bfloat16 compute."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer.model import fusion, qwen2
from trainer.sampling import kv_cache
from trainer.sharding import path_str

# Per compute dtype: the largest logit difference allowed between the two layouts (logits of magnitude ~1-4).
# float32: summation order only; bfloat16: a rounding or two of an 8-bit mantissa where XLA fuses differently.
TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2}


def _flat(tree: Any) -> dict[str, np.ndarray]:
    return {path_str(kp): np.asarray(v) for kp, v in jax.tree_util.tree_leaves_with_path(tree)}


def _unfused_logits(
    params: Any, config: qwen2.Qwen2Config, ids: jax.Array, pos: jax.Array, mask: jax.Array
) -> Any:
    hidden, _ = qwen2.Qwen2(config, fused=False).apply({"params": params}, ids, pos, qwen2.causal_mask(mask))
    return qwen2.logits_from_hidden(params, config, hidden)


def _inputs(B: int = 3, T: int = 9) -> tuple[jax.Array, jax.Array, jax.Array]:
    ids = np.random.default_rng(11).integers(0, 151_665, size=(B, T)).astype(np.int32)
    mask = np.ones((B, T), np.int32)
    mask[1, :4] = 0  # left padding
    pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(mask)


def test_fuse_and_unfuse_are_inverse_and_keep_hf_head_order(tiny_f32: tuple[Any, ...]) -> None:
    config, params = tiny_f32
    unfused = fusion.unfuse_tree(params)
    flat = _flat(unfused)
    assert "layers/self_attn/q_proj/kernel" in flat and "layers/self_attn/qkv_proj/kernel" not in flat
    N, K, H = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    assert flat["layers/self_attn/q_proj/kernel"].shape == (
        config.num_hidden_layers,
        config.hidden_size,
        N * H,
    )
    assert flat["layers/self_attn/k_proj/bias"].shape == (config.num_hidden_layers, K * H)
    assert flat["layers/mlp/up_proj/kernel"].shape[-1] == config.intermediate_size
    again = _flat(fusion.fuse_tree(unfused, K))
    want = _flat(params)
    assert again.keys() == want.keys() and all(np.array_equal(again[k], want[k]) for k in want)
    # Query head n = k * G + g sits with kv head k: the fused [.., K, G + 2, H] read back in HF's column order.
    qkv = want["layers/self_attn/qkv_proj/kernel"]
    G = N // K
    np.testing.assert_array_equal(
        qkv[..., :G, :].reshape(*qkv.shape[:2], N * H), flat["layers/self_attn/q_proj/kernel"]
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_logits_equal_the_separate_projections(tiny_f32: tuple[Any, ...], dtype: str) -> None:
    config, params = tiny_f32
    config = config.replace(dtype=dtype)
    ids, pos, mask = _inputs()
    fused = np.asarray(qwen2.forward_logits(params, config, ids, pos, mask))
    separate = np.asarray(
        jax.jit(_unfused_logits, static_argnums=1)(fusion.unfuse_tree(params), config, ids, pos, mask)
    )
    real = np.asarray(mask, bool)
    assert np.abs(separate[real]).max() > 0.5  # not a comparison of near-zero logits
    diff = np.abs(fused[real] - separate[real]).max()
    assert diff <= TOLERANCE[dtype], f"{dtype}: max abs logit difference {diff}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_step_equals_the_separate_projections(
    tiny_f32: tuple[Any, ...], prompts: tuple[Any, ...], dtype: str
) -> None:
    config, params = tiny_f32
    config = config.replace(dtype=dtype)
    unfused = fusion.unfuse_tree(params)
    prompt_ids, prompt_mask = (jnp.asarray(x) for x in prompts)
    B, P = prompt_ids.shape
    pos = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
    _, kv = qwen2.forward_with_kv(params, config, prompt_ids, pos, prompt_mask)
    cache = kv_cache.mark_written(kv_cache.from_prefill(kv, prompt_mask, P + 3))
    new_B1 = jnp.asarray(np.random.default_rng(5).integers(0, 151_665, size=(B, 1)), jnp.int32)
    new_pos = pos[:, -1:] + 1
    slot_mask = cache.mask_BS[:, None, :]
    fused, keys, values = qwen2.decode_step(
        params, config, new_B1, new_pos, cache.keys, cache.values, cache.index, slot_mask
    )

    @jax.jit
    def separate(p: Any, k_in: jax.Array, v_in: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        model = qwen2.Qwen2(config, fused=False)
        out = model.apply({"params": p}, new_B1, new_pos, slot_mask, (k_in, v_in, cache.index))
        hidden, (k, v) = cast(tuple[jax.Array, tuple[jax.Array, jax.Array]], out)  # apply() is typed loosely
        return qwen2.logits_from_hidden(p, config, hidden), k, v

    want, want_keys, want_values = separate(unfused, cache.keys, cache.values)
    diff = float(jnp.abs(fused - want).max())
    assert float(jnp.abs(want).max()) > 0.5
    assert diff <= TOLERANCE[dtype], f"{dtype}: max abs logit difference {diff}"
    # The new keys and values written at the slot: the same heads in the same cache slots.
    np.testing.assert_allclose(
        np.asarray(keys, np.float32), np.asarray(want_keys, np.float32), atol=TOLERANCE[dtype]
    )
    np.testing.assert_allclose(
        np.asarray(values, np.float32), np.asarray(want_values, np.float32), atol=TOLERANCE[dtype]
    )


def test_gradients_equal_the_separate_projections_fused(tiny_f32: tuple[Any, ...]) -> None:
    """The gradient of a token log-likelihood with respect to the fused weights is the separate weights'
    gradient in the fused layout (float32 compute: summation order only)."""
    config, params = tiny_f32
    ids, pos, mask = _inputs()

    def loss(logits_BTV: jax.Array) -> jax.Array:
        logq = jax.nn.log_softmax(logits_BTV[:, :-1], axis=-1)
        return -(jnp.take_along_axis(logq, ids[:, 1:, None], axis=-1)[..., 0] * mask[:, 1:]).sum()

    fused_grads = jax.jit(jax.grad(lambda p: loss(qwen2.forward_logits(p, config, ids, pos, mask))))(params)
    separate_grads = jax.jit(jax.grad(lambda p: loss(_unfused_logits(p, config, ids, pos, mask))))(
        fusion.unfuse_tree(params)
    )
    got, want = _flat(fused_grads), _flat(fusion.fuse_tree(separate_grads, config.num_key_value_heads))
    assert got.keys() == want.keys()
    for name in got:
        scale = np.abs(want[name]).max()
        assert scale > 0, name  # every weight gets a gradient
        np.testing.assert_allclose(got[name], want[name], atol=1e-5 * max(1.0, scale), rtol=0, err_msg=name)


def test_a_checkpoint_of_the_separate_layout_is_fused_on_restore(
    tiny_f32: tuple[Any, ...], tmp_path: Path
) -> None:
    """An Orbax checkpoint written with separate q/k/v and gate/up (parameters and Adam's moments) restores
    into the fused layout, each leaf placed like the live state's (here split over an 8-device mesh)."""
    import optax

    from trainer import checkpoint, sharding

    config, params = tiny_f32
    opt = optax.adamw(1e-3)
    old_params = fusion.unfuse_tree(params)
    # Moments that differ from the parameters and from zero: one real update's worth.
    grads = jax.tree_util.tree_map(lambda x: jnp.full_like(x, 0.5) + x, old_params)
    _, old_opt = opt.update(grads, opt.init(old_params), old_params)
    checkpoint.save(
        checkpoint.manager(str(tmp_path)), 4, {"params": old_params, "opt_state": old_opt}, {"k": 1}
    )

    mesh = sharding.make_mesh(1, 4, 2)
    live = sharding.shard_params(params, mesh)
    like = {"params": live, "opt_state": opt.init(live)}
    got = checkpoint.restore_latest(checkpoint.manager(str(tmp_path)), like)
    assert got is not None
    step, state, meta = got
    assert (step, meta) == (4, {"k": 1})
    want = _flat(fusion.fuse_tree({"params": old_params, "opt_state": old_opt}, config.num_key_value_heads))
    have = _flat(state)
    assert have.keys() == want.keys() and all(np.array_equal(have[k], want[k]) for k in want)
    qkv = state["params"]["layers"]["self_attn"]["qkv_proj"]["kernel"]
    assert qkv.sharding == live["layers"]["self_attn"]["qkv_proj"]["kernel"].sharding
