"""KV-cache decode logits equal full-forward logits for the same (left-padded) prefix."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from trainer.model import qwen2
from trainer.sampling import kv_cache


def test_cached_decode_matches_full_forward(tiny_f32: tuple, prompts: tuple) -> None:
    config, params = tiny_f32
    prompt_ids, prompt_mask = prompts
    B, P = prompt_ids.shape
    new_BN = np.random.default_rng(3).integers(0, 151_665, size=(B, 4)).astype(np.int32)
    C = new_BN.shape[1]

    full_ids = np.concatenate([prompt_ids, new_BN], axis=1)
    full_mask = np.concatenate([prompt_mask, np.ones_like(new_BN)], axis=1)
    full_pos = np.maximum(np.cumsum(full_mask, axis=1) - 1, 0)
    expected_BTV = np.asarray(
        qwen2.forward_logits(
            params, config, jnp.asarray(full_ids), jnp.asarray(full_pos), jnp.asarray(full_mask)
        )
    )

    _, kv = qwen2.forward_with_kv(
        params, config, jnp.asarray(prompt_ids), jnp.asarray(full_pos[:, :P]), jnp.asarray(prompt_mask)
    )
    cache = kv_cache.from_prefill(kv, jnp.asarray(prompt_mask), P + C)
    shape = (config.num_hidden_layers, B, P + C, config.num_key_value_heads, config.head_dim)
    assert cache.keys.shape == cache.values.shape == shape
    assert int(cache.index) == P
    for t in range(C):
        cache = kv_cache.mark_written(cache)
        logits_B1V, k, v = qwen2.decode_step(
            params, config, jnp.asarray(new_BN[:, t : t + 1]), jnp.asarray(full_pos[:, P + t : P + t + 1]),
            cache.keys, cache.values, cache.index, cache.mask_BS[:, None, :],
        )  # fmt: skip
        cache = cache.replace(keys=k, values=v, index=cache.index + 1)
        np.testing.assert_allclose(np.asarray(logits_B1V[:, 0]), expected_BTV[:, P + t], atol=2e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(cache.mask_BS), full_mask.astype(bool))
