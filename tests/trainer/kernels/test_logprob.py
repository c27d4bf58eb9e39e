"""Every log-prob/entropy implementation against the float32 reference: values and gradients through both
outputs, at float32 and bfloat16 inputs, with ragged row chunks and ragged vocab tiles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.trainer.kernels.conftest import TEMPERATURE, TOL, rel_err
from trainer.kernels.logprob import chunked, fused_lm_head, pallas_lm_head, pallas_tpu, reference
from trainer.kernels.logprob.blocks import BlockSizes, compile_target

# Small tiles so that 48 rows and 1000 columns split unevenly: the last row chunk overlaps, the last vocab
# tile is ragged (1000 = 3 x 256 + 232 = 7 x 128 + 104).
SMALL = BlockSizes(rows=16, vocab=256)
ODD_ROWS = BlockSizes(rows=40, vocab=384)


def objective(fn):
    """A scalar that weighs both outputs with per-token weights of both signs."""

    def loss(*args, x):
        lp, ent = fn(*args, x["ids"], temperature=TEMPERATURE)
        return jnp.sum(x["c_logp"] * lp + x["c_ent"] * ent), (lp, ent)

    return loss


@pytest.fixture(scope="module")
def want(inputs: dict) -> tuple:
    """The reference's (value, aux) and dlogits on the float32 upcast of the inputs."""
    fn = jax.value_and_grad(objective(reference.token_logprob_entropy), has_aux=True)
    return jax.jit(lambda z: fn(z, x=inputs))(inputs["logits"].astype(jnp.float32))


@pytest.mark.parametrize(
    "impl",
    [
        pytest.param(lambda *a, **k: chunked.token_logprob_entropy(*a, blocks=ODD_ROWS, **k), id="chunked"),
        pytest.param(lambda *a, **k: pallas_tpu.token_logprob_entropy(*a, blocks=SMALL, **k), id="pallas"),
    ],
)
def test_logits_impl_matches_reference(impl, inputs: dict, want: tuple) -> None:
    (val, (lp, ent)), dz = jax.jit(lambda z: jax.value_and_grad(objective(impl), has_aux=True)(z, x=inputs))(
        inputs["logits"]
    )
    (want_val, (want_lp, want_ent)), want_dz = want
    tol = TOL[inputs["dtype"]]
    assert dz.dtype == inputs["logits"].dtype and lp.dtype == ent.dtype == jnp.float32
    # Forward values are computed in float32 from the same inputs: float32 tolerance at either dtype.
    assert rel_err(lp, want_lp) <= TOL["float32"]
    assert rel_err(ent, want_ent) <= TOL["float32"]
    assert rel_err(val, want_val) <= TOL["float32"]
    assert rel_err(dz, want_dz) <= tol


def test_fused_lm_head_matches_reference_path(inputs: dict) -> None:
    x, tol = inputs, TOL[inputs["dtype"]]

    def ref(h, w):
        return reference.token_logprob_entropy(h.astype(jnp.float32) @ w.astype(jnp.float32), x["ids"],
                                               temperature=TEMPERATURE)  # fmt: skip

    def fused(h, w):
        return fused_lm_head.token_logprob_entropy_from_hidden(
            h, w, x["ids"], temperature=TEMPERATURE, blocks=ODD_ROWS
        )

    def grads(fn):
        def loss(h, w):
            lp, ent = fn(h, w)
            return jnp.sum(x["c_logp"] * lp + x["c_ent"] * ent), (lp, ent)

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(x["hidden"], x["w"])

    (_, (lp, ent)), (dh, dw) = grads(fused)
    (_, (want_lp, want_ent)), (want_dh, want_dw) = grads(ref)
    assert dh.dtype == x["hidden"].dtype and dw.dtype == x["w"].dtype
    assert rel_err(lp, want_lp) <= tol and rel_err(ent, want_ent) <= tol
    assert rel_err(dh, want_dh) <= tol
    assert rel_err(dw, want_dw) <= tol


def test_reference_matches_numpy_transcription() -> None:
    rng = np.random.default_rng(3)
    z = rng.normal(0, 3.0, (2, 5, 50))
    ids = rng.integers(0, 50, (2, 5))
    s = z / TEMPERATURE
    logq = s - s.max(-1, keepdims=True)
    logq = logq - np.log(np.exp(logq).sum(-1, keepdims=True))
    want_lp = np.take_along_axis(logq, ids[..., None], -1)[..., 0]
    want_ent = -(np.exp(logq) * logq).sum(-1)
    lp, ent = reference.token_logprob_entropy(
        jnp.asarray(z, jnp.float32), jnp.asarray(ids), temperature=TEMPERATURE
    )
    np.testing.assert_allclose(lp, want_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, want_ent, rtol=1e-5, atol=1e-5)


def test_gradient_flows_from_each_output_alone() -> None:
    """dlogits of logp alone is onehot - p; of entropy alone -p (log p + H): each checked separately."""
    rng = np.random.default_rng(4)
    z = jnp.asarray(rng.normal(0, 2.0, (1, 8, 300)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 300, (1, 8)), jnp.int32)
    blocks = BlockSizes(rows=8, vocab=128)

    def small(*a, **kw):
        return chunked.token_logprob_entropy(*a, blocks=blocks, **kw)

    for k in (0, 1):

        def loss(z, fn, k=k):
            return jnp.sum(fn(z, ids, temperature=TEMPERATURE)[k])

        got = jax.grad(loss)(z, small)
        want = jax.grad(loss)(z, reference.token_logprob_entropy)
        assert rel_err(got, want) <= TOL["float32"]
        assert float(jnp.abs(want).max()) > 1e-3  # the output really carries gradient


def test_pallas_alias_dlogits_gives_same_gradient() -> None:
    rng = np.random.default_rng(5)
    z = jnp.asarray(rng.normal(0, 2.0, (1, 16, 300)), jnp.bfloat16)
    ids = jnp.asarray(rng.integers(0, 300, (1, 16)), jnp.int32)

    def loss(z, alias):
        lp, ent = pallas_tpu.token_logprob_entropy(
            z, ids, temperature=TEMPERATURE, blocks=SMALL, alias_dlogits=alias
        )
        return jnp.sum(lp - 0.3 * ent)

    a, b = (jax.jit(jax.grad(loss), static_argnums=1)(z, alias) for alias in (False, True))
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_pallas_sharded_over_batch_matches_unsharded() -> None:
    devs = np.array(jax.devices()[:4])
    mesh = jax.sharding.Mesh(devs, ("dp",))
    rng = np.random.default_rng(6)
    z = jnp.asarray(rng.normal(0, 2.0, (4, 16, 300)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 300, (4, 16)), jnp.int32)
    fn = pallas_tpu.sharded(mesh, "dp", temperature=TEMPERATURE, blocks=SMALL)
    lp, ent = jax.jit(fn)(z, ids)
    want_lp, want_ent = reference.token_logprob_entropy(z, ids, temperature=TEMPERATURE)
    assert rel_err(lp, want_lp) <= TOL["float32"] and rel_err(ent, want_ent) <= TOL["float32"]
    assert len(lp.sharding.device_set) == 4


@pytest.mark.slow
def test_pallas_under_tpu_interpreter_with_nan_uninitialised_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The TPU-faithful interpreter fills the ragged tile's out-of-bounds columns with NaN, as stale VMEM
    would be on hardware: the masking must keep them out of the statistics and the gradient."""
    from jax.experimental.pallas import tpu as pltpu

    monkeypatch.setattr(pallas_tpu, "_interpret", lambda: pltpu.InterpretParams(uninitialized_memory="nan"))
    rng = np.random.default_rng(7)
    z = jnp.asarray(rng.normal(0, 2.0, (1, 32, 600)), jnp.bfloat16)  # 600 = 2 x 256 + 88: a ragged tile
    ids = jnp.asarray(rng.integers(0, 600, (1, 32)), jnp.int32)

    def loss(z, fn, **kw):
        lp, ent = fn(z, ids, temperature=TEMPERATURE, **kw)
        return jnp.sum(lp - 0.3 * ent), (lp, ent)

    (_, (lp, ent)), dz = jax.value_and_grad(loss, has_aux=True)(
        z, pallas_tpu.token_logprob_entropy, blocks=SMALL
    )
    (_, (want_lp, want_ent)), want_dz = jax.value_and_grad(loss, has_aux=True)(
        z, reference.token_logprob_entropy
    )
    assert rel_err(lp, want_lp) <= TOL["float32"] and rel_err(ent, want_ent) <= TOL["float32"]
    assert rel_err(dz, want_dz) <= TOL["bfloat16"]


def test_pallas_lm_head_chunks_are_larger_on_a_tpu_and_never_padded_past_the_last_tile() -> None:
    """Each chunk reads and writes the [D, V] float32 weight-gradient accumulator whole, so a TPU takes up to
    TPU_CHUNK_ROWS rows a chunk: the most tiles that divide the rows' tiles (no padding beyond the last tile);
    elsewhere CHUNK_TILES tiles, as before."""
    plh = pallas_lm_head
    blocks = BlockSizes(rows=256, vocab=2048)
    assert plh._chunks(16384, blocks) == plh.CHUNK_TILES * 256  # this process: CPU
    with compile_target("tpu TPU v6 lite"):
        assert plh._chunks(16384, blocks) == plh.TPU_CHUNK_ROWS == 4096  # the seed's update: 4 chunks, not 16
        assert plh._chunks(63 * 256, blocks) == 9 * 256  # 63 tiles: 7 chunks of 9, none padded
        assert plh._chunks(61 * 256, blocks) == 256  # a prime count of tiles: one tile a chunk
        assert plh._chunks(300, blocks) == 512  # fewer rows than a chunk: one chunk, padded to whole tiles
