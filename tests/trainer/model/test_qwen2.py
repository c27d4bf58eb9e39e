"""Behaviour of the Flax Qwen2: causality, padding, hidden + lm_head == logits, gradients, bf16 compute."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from trainer.model import attention, qwen2


def _positions(mask_BT: np.ndarray) -> jnp.ndarray:
    return jnp.maximum(jnp.cumsum(jnp.asarray(mask_BT), axis=1) - 1, 0)


def test_future_tokens_do_not_change_past_logits(tiny_f32: tuple) -> None:
    config, params = tiny_f32
    ids = np.random.default_rng(1).integers(0, 151_000, size=(1, 10)).astype(np.int32)
    changed = ids.copy()
    changed[0, 6:] = (changed[0, 6:] + 17) % 151_000
    mask = np.ones_like(ids)
    a = qwen2.forward_logits(params, config, jnp.asarray(ids), _positions(mask), jnp.asarray(mask))
    b = qwen2.forward_logits(params, config, jnp.asarray(changed), _positions(mask), jnp.asarray(mask))
    np.testing.assert_array_equal(np.asarray(a[:, :6]), np.asarray(b[:, :6]))
    assert np.abs(np.asarray(a[:, 6:] - b[:, 6:])).max() > 1e-3


def test_left_padding_does_not_change_real_token_logits(tiny_f32: tuple) -> None:
    config, params = tiny_f32
    ids = np.random.default_rng(2).integers(0, 151_000, size=(1, 6)).astype(np.int32)
    padded = np.concatenate([np.full((1, 4), 151_643, np.int32), ids], axis=1)
    mask = np.concatenate([np.zeros((1, 4), np.int32), np.ones((1, 6), np.int32)], axis=1)
    plain = qwen2.forward_logits(
        params, config, jnp.asarray(ids), _positions(np.ones_like(ids)), jnp.ones_like(ids)
    )
    left = qwen2.forward_logits(params, config, jnp.asarray(padded), _positions(mask), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(left[:, 4:]), np.asarray(plain), atol=1e-5, rtol=0)


def test_hidden_times_lm_head_is_logits_and_differentiable(tiny_f32: tuple) -> None:
    config, params = tiny_f32
    ids = jnp.asarray(np.random.default_rng(3).integers(0, 151_000, size=(2, 5)), jnp.int32)
    mask = jnp.ones_like(ids)
    pos = _positions(np.ones((2, 5), np.int32))
    hidden_BTD = qwen2.forward_hidden(params, config, ids, pos, mask)
    w_DV = qwen2.lm_head_weight(params, config)
    assert w_DV.shape == (config.hidden_size, config.vocab_size)
    np.testing.assert_allclose(
        np.asarray(hidden_BTD @ w_DV),
        np.asarray(qwen2.forward_logits(params, config, ids, pos, mask)),
        atol=1e-5,
    )

    def token_logprob_sum(p: dict) -> jnp.ndarray:
        h = qwen2.forward_hidden(p, config, ids, pos, mask)
        logq = jax.nn.log_softmax(h @ qwen2.lm_head_weight(p, config), axis=-1)
        return jnp.take_along_axis(logq[:, :-1], ids[:, 1:, None], axis=-1).sum()

    grads = jax.device_get(jax.jit(jax.grad(token_logprob_sum))(params))
    norms = {k: float(np.sqrt(sum(np.sum(g * g) for g in jax.tree.leaves(v)))) for k, v in grads.items()}
    assert all(np.isfinite(n) and n > 0 for n in norms.values()), norms


def test_bf16_compute_tracks_float32(tiny_f32: tuple) -> None:
    config, params = tiny_f32
    ids = jnp.asarray(np.random.default_rng(4).integers(0, 151_000, size=(2, 8)), jnp.int32)
    mask = jnp.ones_like(ids)
    pos = _positions(np.ones((2, 8), np.int32))
    f32 = np.asarray(qwen2.forward_logits(params, config, ids, pos, mask))
    bf16 = qwen2.forward_logits(params, config.replace(dtype="bfloat16"), ids, pos, mask)
    assert bf16.dtype == jnp.float32
    # bf16 has 8 mantissa bits: logits of magnitude ~3 carry errors of a few 1e-2 after 2 layers.
    assert np.abs(np.asarray(bf16) - f32).max() < 0.1
    assert (np.asarray(bf16).argmax(-1) == f32.argmax(-1)).mean() >= 0.9


def test_init_params_is_seeded(tiny_f32: tuple) -> None:
    config, _ = tiny_f32
    a = qwen2.init_params(config, jax.random.key(5))
    b = qwen2.init_params(config, jax.random.key(5))
    c = qwen2.init_params(config, jax.random.key(6))
    leaf = ("layers", "self_attn", "q_proj", "kernel")
    get = lambda p: np.asarray(p[leaf[0]][leaf[1]][leaf[2]][leaf[3]])  # noqa: E731
    np.testing.assert_array_equal(get(a), get(b))
    assert not np.array_equal(get(a), get(c))
    assert abs(float(get(a).std()) - config.initializer_range) < 0.02


def test_rope_half_by_half_gives_the_bits_and_gradients_of_rotate_half() -> None:
    """`_apply_rope` is written half by half so that XLA fuses it in the input's dtype; it must stay HF's
    `x * cos + rotate_half(x) * sin` in float32, bit for bit, forward and backward, in float32 and bfloat16."""

    def rotate_half_form(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        half = x.shape[-1] // 2
        rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
        return (x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(x.dtype)

    config = qwen2.Qwen2Config(hidden_size=256, num_attention_heads=4)  # head_dim 64
    cos, sin = attention.rope_cos_sin(jnp.arange(14).reshape(2, 7) * 37, config)
    for dtype in (jnp.float32, jnp.bfloat16):
        x = jax.random.normal(jax.random.key(0), (2, 7, 3, 64)).astype(dtype)
        np.testing.assert_array_equal(
            np.asarray(jax.jit(attention.apply_rope)(x, cos, sin)),
            np.asarray(jax.jit(rotate_half_form)(x, cos, sin)),
        )
        weights = jax.random.normal(jax.random.key(1), x.shape)  # a cotangent that is not all ones
        grads = [jax.grad(lambda x, fn=fn, w=weights: (fn(x, cos, sin).astype(jnp.float32) * w).sum())(x)
                 for fn in (attention.apply_rope, rotate_half_form)]  # fmt: skip
        np.testing.assert_array_equal(np.asarray(grads[0]), np.asarray(grads[1]))
