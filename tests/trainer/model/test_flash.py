"""The Pallas (splash) self-attention against `attention.attend` over `causal_mask`: outputs and gradients w.r.t. q, k
and v for real tokens, with left and right padding and grouped-query heads, on one device and split over a
mesh; and a whole tiny model's GRPO loss and parameter gradients with `attention` pallas against xla.
The kernel runs in Pallas interpret mode here; `tpuops fit` lowers the same call to Mosaic for a TPU.

Tolerances. float32: both paths compute q @ k and the softmax in float32 and differ only in summation order
(the kernel's online softmax over 128-key blocks, its deferred normalisation): a few float32 ulps of the
largest value, so 1e-5 relative to the largest output or gradient. bfloat16: each path rounds differently
(the kernel scales q by 1/sqrt(H) in bfloat16 before q @ k and multiplies float32 probabilities by v, the
reference scales float32 scores and rounds the probabilities to bfloat16 first, and the output is rounded
to bfloat16): a few bfloat16 ulps (2^-8 relative) of the largest value, so 2e-2 relative to it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.trainer.model.grads import assert_grads_close
from trainer import config as trainer_config
from trainer.loop.programs import make_loss_fn
from trainer.model import attention, flash, qwen2
from trainer.model.config import preset
from trainer.sharding import make_mesh

# Dims: B batch, T tokens (two 128-key blocks: the online softmax crosses a block), N query heads, K kv heads,
# H head dim.
B, T, N, K, H = 2, 256, 4, 2, 32
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


def _draw(seed: int, dtype: Any, b: int = B, t: int = T) -> tuple[jax.Array, ...]:
    """Fresh q, k, v; a left-padded row (its padding crosses the first block) and a left- and right-padded
    row (a completion that ended before the buffer did); a cotangent on real rows only, of both signs."""
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(0.0, 1.0, (b, t, n, H)), dtype) for n in (N, K, K))
    mask = np.ones((b, t), np.int32)
    mask[0, : t // 2 + 37] = 0
    mask[1 % b, :5] = 0
    mask[1 % b, t - 40 :] = 0
    g = rng.normal(0.0, 1.0, (b, t, N, H)) * mask[:, :, None, None]
    return q, k, v, jnp.asarray(mask), jnp.asarray(g, jnp.float32)


def _value_and_grads(attn: Any, q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array) -> Any:
    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = attn(q, k, v)
        return jnp.sum(out.astype(jnp.float32) * g), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def _close(got: jax.Array, want: jax.Array, rows: np.ndarray, tol: float, what: str) -> None:
    got_, want_ = np.asarray(got, np.float32)[rows], np.asarray(want, np.float32)[rows]
    scale = np.abs(want_).max()
    err = np.abs(got_ - want_).max() / scale
    assert err <= tol, f"{what}: max error {err:.2e} of the largest value {scale:.3g} (tolerance {tol:.0e})"


def _compare(dtype: Any, seed: int, b: int = B, t: int = T) -> None:
    q, k, v, mask, g = _draw(seed, dtype, b, t)
    want_out, want_grads = _value_and_grads(
        lambda q, k, v: attention.attend(q, k, v, qwen2.causal_mask(mask)), q, k, v, g
    )
    got_out, got_grads = _value_and_grads(lambda q, k, v: flash.attend_flash(q, k, v, mask), q, k, v, g)
    real = np.asarray(mask, bool)
    assert np.isfinite(np.asarray(got_out, np.float32)).all(), "padding rows must stay finite"
    _close(got_out, want_out, real, TOL[dtype], "output")
    # Gradients everywhere: padding rows carry no cotangent, so both paths give their q exactly 0 and their k, v
    # only what real queries send (none: no real query sees a padding key).
    everywhere = np.ones_like(real)
    for name, got, want in zip("qkv", got_grads, want_grads, strict=True):
        _close(got, want, everywhere, TOL[dtype], f"d{name}")


@pytest.mark.parametrize(
    ("dtype", "b", "t"), [(jnp.float32, 1, T), (jnp.bfloat16, 1, T)], ids=["float32", "bfloat16"]
)
def test_flash_matches_attend_with_padding_and_gqa(dtype: Any, b: int, t: int) -> None:
    """float32 over two key blocks (one row, left padding past the first block and right padding); bfloat16 over
    one block and two rows. (Interpret mode compiles every grid step: ~0.2 s of CPU each, so shapes stay small.)"""
    _compare(dtype, seed=0, b=b, t=t)


@pytest.mark.parametrize(("dp", "fsdp", "tp"), [(1, 2, 2), (1, 4, 1)])
def test_flash_under_a_mesh_matches_attend(dp: int, fsdp: int, tp: int) -> None:
    """Rows over the batch axes and kv heads over tp (1 x 2 x 2); a batch the axes do not divide is replicated
    (1 x 4 x 1 with 2 rows): the gradients of a replicated input must not be summed over its copies."""
    mesh = make_mesh(dp, fsdp, tp, jax.devices()[: dp * fsdp * tp])
    with jax.set_mesh(mesh):
        _compare(jnp.float32, seed=1, t=128)


def test_wrong_shapes_are_refused_before_the_kernel() -> None:
    q, k, v, mask, _ = _draw(2, jnp.float32, t=128)
    with pytest.raises(ValueError, match=r"multiple of 128 .*received 100"):
        flash.attend_flash(q[:, :100], k[:, :100], v[:, :100], mask[:, :100])
    with pytest.raises(ValueError, match=r"attention mask \[B, T\]"):
        flash.attend_flash(q, k, v, mask[:, :64])
    with pytest.raises(ValueError, match="K dividing N"):
        flash.attend_flash(q[:, :, :3], k, v, mask)


def test_resolve_picks_pallas_only_on_a_tpu_where_the_length_allows() -> None:
    assert flash.resolve("auto", 1536, on_tpu=True) == "pallas"
    assert flash.resolve("auto", 1536, on_tpu=False) == "xla"
    assert flash.resolve("auto", 1000, on_tpu=True) == "xla"
    assert flash.resolve("xla", 1536, on_tpu=True) == "xla"
    assert flash.resolve("pallas", 256, on_tpu=False) == "pallas"
    with pytest.raises(ValueError, match=r"multiple of 128 .*received 1000"):
        flash.resolve("pallas", 1000, on_tpu=True)
    with pytest.raises(ValueError, match="received 'splash'"):
        flash.resolve("splash", 1536)
    with pytest.raises(ValueError, match=r"train.attention_impl=pallas needs .* received \[216, 280\]"):
        trainer_config.load("tiny", ["train.attention_impl=pallas"])
    with pytest.raises(ValueError, match="multiple of 128, received 96"):
        flash.Blocks(q=96)
    assert flash.Blocks(512, 512).fitted(1536) == flash.Blocks(512, 512)
    assert flash.Blocks(512, 512).fitted(640) == flash.Blocks(128, 128)


@pytest.mark.slow
def test_tiny_model_grpo_loss_and_gradients_equal_with_pallas_attention() -> None:
    """The update's loss function (forward, GRPO objective, backward through both decoder layers) over left-padded
    prompts and a completion that ends early: the same loss and parameter gradients with either attention. The
    tiny preset's shapes with a 1,024-token vocabulary (the LM head is not what is compared; its 151,936 rows
    would only add compile time). Gradients pass two layers, norms and the log-softmax: 1e-4 of each leaf's
    largest gradient (float32 summation order, amplified)."""
    mconf = preset("tiny").replace(vocab_size=1024, dtype="float32")
    params = qwen2.init_params(mconf, jax.random.key(0))
    P_len, C = 64, 64
    cfg = trainer_config.load("tiny", [f"rollout.max_new_tokens={C}", f"data.prompt_buckets=[{P_len}]"])
    rng = np.random.default_rng(5)
    b = 2
    prompt_mask = np.ones((b, P_len), np.int32)
    prompt_mask[0, :40] = 0
    prompt_mask[1, :3] = 0
    comp_mask = np.ones((b, C), np.int32)
    comp_mask[0, 20:] = 0
    mask = np.concatenate([prompt_mask, comp_mask], axis=1)
    ids = rng.integers(0, mconf.vocab_size, (b, P_len + C)).astype(np.int32)
    mb = {
        "ids": ids, "mask": mask, "pos": np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32),
        "comp": ids[:, P_len:], "comp_mask": comp_mask,
        "old_logp": rng.normal(-7.0, 0.5, (b, C)).astype(np.float32),  # ratios outside the clip range too
        "adv": np.array([1.3, -0.7], np.float32),  # both signs
    }  # fmt: skip
    batch = {key: jnp.asarray(x) for key, x in mb.items()}
    tokens = jnp.float32(comp_mask.sum())

    def run(attention: str) -> tuple[jax.Array, Any]:
        loss_fn = make_loss_fn(cfg, mconf.replace(attention=attention), P_len, "reference")
        (loss, _), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, batch, tokens)
        return loss, grads

    want_loss, want_grads = run("xla")
    got_loss, got_grads = run("pallas")
    np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=TOL[jnp.float32])
    assert_grads_close(got_grads, want_grads, 1e-4)


def test_prefill_with_pallas_attention_gives_the_same_hidden_states_and_cache() -> None:
    """forward_with_kv (the rollout's prefill) over left-padded prompts: the hidden states and every layer's keys
    and values at real positions are the XLA path's (the decode reads only those slots)."""
    mconf = preset("tiny").replace(vocab_size=1024, dtype="float32")
    params = qwen2.init_params(mconf, jax.random.key(1))
    rng = np.random.default_rng(6)
    mask = np.ones((2, 128), np.int32)
    mask[0, :90] = 0
    mask[1, :1] = 0
    ids = jnp.asarray(rng.integers(0, mconf.vocab_size, mask.shape), jnp.int32)
    pos = jnp.asarray(np.maximum(np.cumsum(mask, axis=1) - 1, 0), jnp.int32)
    want_h, (want_k, want_v) = qwen2.forward_with_kv(params, mconf, ids, pos, jnp.asarray(mask))
    got_h, (got_k, got_v) = qwen2.forward_with_kv(
        params, mconf.replace(attention="pallas"), ids, pos, jnp.asarray(mask)
    )
    real = mask.astype(bool)
    _close(got_h, want_h, real, 1e-5, "hidden")
    for name, got, want in (("keys", got_k, want_k), ("values", got_v, want_v)):
        _close(np.moveaxis(np.asarray(got), 0, 2), np.moveaxis(np.asarray(want), 0, 2), real, 1e-5, name)
