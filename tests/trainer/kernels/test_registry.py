"""The `impl` registry, `auto`, the public dispatch functions and the self-checking block sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.trainer.kernels.conftest import TEMPERATURE, TOL, draw, rel_err
from trainer import kernels
from trainer.kernels.ce import reference as ce_reference
from trainer.kernels.logprob.blocks import TUNED, BlockSizes, for_device


def test_resolve_impl_auto_per_backend_and_rejects_unknown() -> None:
    assert kernels.resolve_impl("auto", "cpu") == "chunked"
    assert kernels.resolve_impl("auto", "gpu") == "chunked"
    assert kernels.resolve_impl("auto", "tpu") == "pallas"
    assert kernels.resolve_impl("auto") == "chunked"  # this test session runs on CPU
    for name in kernels.IMPLS:
        assert kernels.resolve_impl(name, "tpu") == name
    with pytest.raises(ValueError, match=r"received 'triton'"):
        kernels.resolve_impl("triton")


def test_block_sizes_check_themselves() -> None:
    with pytest.raises(ValueError, match="rows must be a positive multiple of 8, received 12"):
        BlockSizes(rows=12)
    with pytest.raises(ValueError, match="vocab must be a positive multiple of 128, received 1000"):
        BlockSizes(vocab=1000)
    with pytest.raises(ValueError, match="multiple of 16 for bfloat16 logits, received 8"):
        BlockSizes(rows=8).check_dtype(jnp.bfloat16)
    assert BlockSizes(rows=8).check_dtype(jnp.float32).rows == 8
    assert for_device("pallas", "TPU v6 lite") is TUNED["tpu"]["pallas"]
    assert for_device("chunked", "NVIDIA H100 80GB HBM3") is TUNED["gpu"]["chunked"]
    assert for_device("chunked") is TUNED["cpu"]["chunked"]  # this session's device
    assert for_device("chunked", "cpu").rows > 0


def test_public_functions_dispatch_every_impl() -> None:
    x = draw(11, "float32")
    want_lp, want_ent = kernels.token_logprob_entropy(
        x["logits"], x["ids"], temperature=TEMPERATURE, impl="reference"
    )
    for impl in ("chunked", "pallas", "fused_lm_head", "auto"):
        lp, ent = kernels.token_logprob_entropy(x["logits"], x["ids"], temperature=TEMPERATURE, impl=impl)
        assert rel_err(lp, want_lp) <= TOL["float32"] and rel_err(ent, want_ent) <= TOL["float32"], impl
    with pytest.raises(ValueError, match="disagree"):
        kernels.token_logprob_entropy(x["logits"], x["ids"][:, :-1])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        kernels.token_logprob_entropy(x["logits"], x["ids"], temperature=0.0)


def test_hidden_variants_agree_with_the_logits_path() -> None:
    x = draw(12, "float32")
    z = x["hidden"] @ x["w"]
    want_lp, want_ent = kernels.token_logprob_entropy(z, x["ids"], temperature=TEMPERATURE, impl="reference")
    for impl in ("fused_lm_head", "chunked"):
        lp, ent = kernels.token_logprob_entropy_from_hidden(
            x["hidden"], x["w"], x["ids"], temperature=TEMPERATURE, impl=impl
        )
        assert rel_err(lp, want_lp) <= TOL["float32"] and rel_err(ent, want_ent) <= TOL["float32"], impl


@pytest.mark.parametrize("impl", ["chunked", "pallas"])
def test_cross_entropy_value_and_grad_match_reference(impl: str) -> None:
    x = draw(13, "float32")
    mask = jnp.asarray(np.arange(x["ids"].shape[1])[None, :] < np.array([[24], [10]]), jnp.float32)
    want, want_dz = jax.value_and_grad(ce_reference.cross_entropy)(x["logits"], x["ids"], mask)
    got, dz = jax.jit(jax.value_and_grad(lambda z: kernels.cross_entropy(z, x["ids"], mask, impl=impl)))(
        x["logits"]
    )
    assert rel_err(got, want) <= TOL["float32"] and rel_err(dz, want_dz) <= TOL["float32"]
    assert float(jnp.abs(dz[1, 10:]).max()) == 0.0  # padded tokens get no gradient
    # The definition itself, transcribed in NumPy.
    z = np.asarray(x["logits"], np.float64)
    logq = z - z.max(-1, keepdims=True)
    logq -= np.log(np.exp(logq).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logq, np.asarray(x["ids"])[..., None], -1)[..., 0]
    np.testing.assert_allclose(
        float(want), (nll * np.asarray(mask)).sum() / np.asarray(mask).sum(), rtol=1e-5
    )


def test_cross_entropy_from_hidden_fused_matches_reference() -> None:
    x = draw(14, "float32")
    mask = jnp.ones(x["ids"].shape, jnp.float32).at[0, -5:].set(0.0)

    def ce(h, w, impl):
        return kernels.cross_entropy_from_hidden(h, w, x["ids"], mask, impl=impl)

    want, want_g = jax.value_and_grad(ce, argnums=(0, 1))(x["hidden"], x["w"], "reference")
    got, g = jax.jit(jax.value_and_grad(ce, argnums=(0, 1)), static_argnums=2)(
        x["hidden"], x["w"], "fused_lm_head"
    )
    assert rel_err(got, want) <= TOL["float32"]
    assert rel_err(g[0], want_g[0]) <= TOL["float32"] and rel_err(g[1], want_g[1]) <= TOL["float32"]
