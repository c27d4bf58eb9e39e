"""`rollout.attention_impl: pallas` (trainer/model/decode_attention.py), the decode's attention over its cache as
one Pallas GPU kernel, against the xla path the decode layer takes (`attention.attend` over the window, or
`group_prompt` + `completion_slots` + `attend_shared_prompt` for groups sharing a prompt). On CPU the kernel runs
in Pallas interpret mode: its indexing, blocks, masks and online softmax are what is checked."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer.model import attention, decode_attention

L, U, G, K, N, H = 2, 2, 4, 2, 8, 32
B = U * G
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


def _case(seed: int, dtype: Any, P: int, C: int, index: int) -> tuple[jax.Array, ...]:
    """A stacked cache [L, B, P + C, K, H] whose groups of G rows hold their prompt's slots in the first row only
    (the prefill writes the same slots to every row of a group; here the others hold noise, so reading them is
    caught), left-padded prompts of different lengths, completion slots written up to `index`
    (the rest random, as unwritten slots never are zeros to rely on), one position's queries [B, 1, N, H]."""
    rng = np.random.default_rng(seed)
    S = P + C
    keys, values = (rng.normal(0, 1, (L, B, S, K, H)).astype(np.float32) for _ in range(2))
    mask = np.zeros((B, 1, S), bool)
    for u, pad in enumerate((3, P // 2)[:U]):
        mask[u * G : (u + 1) * G, 0, pad:P] = True
    mask[:, 0, P : index + 1] = True
    q = rng.normal(0, 1, (B, 1, N, H)).astype(np.float32)
    return tuple(
        jnp.asarray(x, dtype) if x.dtype != bool else jnp.asarray(x) for x in (q, keys, values, mask)
    )


def _reference(q: jax.Array, keys: jax.Array, values: jax.Array, layer: int, mask: jax.Array, P: int,
               window: int, samples: int) -> jax.Array:  # fmt: skip
    """What trainer.model.layers.Attention computes with the xla attention for these arguments."""
    window = window or keys.shape[2]
    if samples > 1 and 0 < P < window:
        kp, vp = attention.group_prompt(keys, values, jnp.int32(layer), P, samples)
        kc, vc = attention.completion_slots(keys, values, jnp.int32(layer), P, window)
        return attention.attend_shared_prompt(q, kp, vp, kc, vc, mask[..., :window])
    return attention.attend(q, keys[layer, :, :window], values[layer, :, :window], mask[..., :window])


def _close(got: jax.Array, want: jax.Array, tol: float) -> None:
    got_, want_ = np.asarray(got, np.float32), np.asarray(want, np.float32)
    err = np.abs(got_ - want_).max() / np.abs(want_).max()
    assert err <= tol, f"max error {err:.2e} of the largest value (tolerance {tol:.0e})"


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("window", [47, 48, 96], ids=["window-rounded-up", "first-window", "whole-cache"])
def test_kernel_matches_the_shared_prompt_reference(dtype: Any, window: int) -> None:
    """Groups sharing a prompt: the prompt slots from each group's first row, the window's completion slots from
    each row's own; layer 1 of the stack, picked by a traced index (the scan's layer loop). A window of 47 slots
    is read as 48 (the decode's last window ends a slot short of the cache), the extra slot unwritten noise."""
    P, C = 32, 64
    q, keys, values, mask = _case(0, dtype, P, C, index=P + 9)
    want = _reference(q, keys, values, 1, mask, P, window, G)
    run = jax.jit(lambda q, k, v, layer, m: decode_attention.decode_attention(
        q, k, v, layer, m, prompt=P, window=window, samples=G))  # fmt: skip
    got = run(q, keys, values, jnp.int32(1), mask)
    assert got.shape == (B, 1, N, H) and got.dtype == dtype
    _close(got, want, TOL[dtype])


def test_kernel_over_the_whole_cache_of_rows_without_groups_matches_attend() -> None:
    """One sample per prompt, window 0 (every slot of the cache): `attend` over layer 0's slots."""
    P, C = 16, 32
    q, keys, values, mask = _case(1, jnp.float32, P, C, index=P + 20)
    want = _reference(q, keys, values, 0, mask, P, 0, 1)
    got = decode_attention.decode_attention(
        q, keys, values, jnp.int32(0), mask, prompt=P, window=0, samples=1
    )
    _close(got, want, TOL[jnp.float32])


def test_shapes_the_kernel_cannot_take_are_named() -> None:
    q, keys, values, mask = _case(2, jnp.float32, 24, 32, index=30)
    with pytest.raises(ValueError, match=r"attention_impl=pallas: the prompt slots \(24\) must be a multiple of "
                       r"16 and the window .*; rollout.attention_impl=xla"):  # fmt: skip
        decode_attention.decode_attention(q, keys, values, 0, mask, prompt=24, window=0, samples=G)
    assert "at most 16 query heads" in decode_attention.unsupported((1, 8, 64, 1, 32), 32, 0, 64, 1)
    assert "power of two" in decode_attention.unsupported((1, 8, 64, 2, 24), 4, 0, 64, 1)
    assert "whole groups of 3" in decode_attention.unsupported((1, 8, 64, 2, 32), 4, 16, 64, 3)
    assert "fit in the 40-slot cache" in decode_attention.unsupported((1, 8, 40, 2, 32), 4, 16, 39, 1)
    # the seed's windows: P 512 and windows of 128 positions, the last one short of the cache by one slot
    assert decode_attention.plan(512, 640, 1536) == (128, 640)
    assert decode_attention.plan(512, 1535, 1536) == (128, 1536)
    assert decode_attention.plan(32, 47, 64) == (16, 48) and decode_attention.plan(64, 192, 192) == (64, 192)


PAD, NO_EOS = 151_643, (-1,)


def _prompts16(n: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` left-padded prompts in a bucket of 16 (the kernel's block), each repeated for G samples."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 151_665, size=(n, 16)).astype(np.int32)
    mask = np.ones((n, 16), np.int32)
    mask[1, :5], mask[-1, :11] = 0, 0
    ids[mask == 0] = PAD
    return np.repeat(ids, G, axis=0), np.repeat(mask, G, axis=0)


@pytest.mark.parametrize("tp", [0, 2, 4], ids=["one-device", "tp2-by-head", "tp4-by-head-and-sequence"])
def test_decode_with_the_kernel_draws_the_xla_attentions_tokens(tiny_f32: tuple, tp: int) -> None:
    """`generate` with SamplingConfig(attention="pallas") against the xla attention: the same greedy tokens and
    log-probs (a draw at temperature 1 over the tiny model's flat 151k-token distribution can move to a
    neighbouring id on a last-digit difference: tests/trainer/sampling/test_sampler.py's `_same_draws`), over
    groups of G samples sharing a prompt, in windows of 16 positions; on one device with the scan and the
    unrolled layer loop, and on the decode layout over 8 devices (the kernel per device under shard_map, the
    cache split by kv head, and by head and sequence)."""
    from trainer.sampling.sampler import SamplingConfig, generate

    config, params = tiny_f32
    kw: dict[str, Any] = {}
    loops = ("scan", "unrolled")
    if tp:
        from trainer.layout import decode_layout
        from trainer.sharding import make_mesh, shard_params

        mesh = make_mesh(dp=1, fsdp=8, tp=1)
        rmesh, to_decode = decode_layout(mesh, config, params, tp)
        params, kw, loops = to_decode(shard_params(params, mesh)), {"mesh": rmesh}, ("scan",)
    ids, mask = _prompts16(4 if tp else 2)
    for layers in loops:
        runs = {}
        for a in ("xla", "pallas"):
            sampling = SamplingConfig(32, greedy=True, block=16, layers=layers, attention=a)
            runs[a] = generate(
                params, config, ids, mask, jax.random.key(5), sampling, NO_EOS, PAD, samples=G, **kw
            )
        xla, pallas = runs["xla"], runs["pallas"]
        np.testing.assert_array_equal(np.asarray(pallas.completion_ids_BC), np.asarray(xla.completion_ids_BC))
        np.testing.assert_allclose(np.asarray(pallas.logprobs_BC), np.asarray(xla.logprobs_BC), atol=1e-4)
        assert len({tuple(r) for r in np.asarray(xla.completion_ids_BC)}) > 1  # the prompts' tokens differ


def test_the_config_refuses_shapes_and_platforms_the_kernel_cannot_take() -> None:
    """`rollout.attention_impl=pallas` is checked when the config loads (every prompt bucket and max_new_tokens a
    multiple of 16) and when the sampling settings are made for a platform (a GPU kernel: refused on a TPU)."""
    from trainer import config
    from trainer.sampling.sampler import for_rollout

    ok = config.load("tiny", ["rollout.attention_impl=pallas", "data.prompt_buckets=[16,32]",
                              "rollout.max_new_tokens=48"])  # fmt: skip
    assert for_rollout(ok.rollout, "gpu").attention == "pallas"
    assert for_rollout(ok.rollout, "cpu").attention == "pallas"  # interpret mode: the tests
    assert for_rollout(config.load("tiny", []).rollout, "tpu").attention == "xla"  # the default
    with pytest.raises(ValueError, match=r"rollout.attention_impl=pallas is a GPU kernel .* on a TPU use "
                       r"rollout.attention_impl=xla"):  # fmt: skip
        for_rollout(ok.rollout, "tpu")
    with pytest.raises(ValueError, match=r"rollout.attention_impl=pallas needs every prompt bucket and "
                       r"rollout.max_new_tokens to be multiples of 16 .*received \[16, 24, 40\]"):  # fmt: skip
        config.load("tiny", ["rollout.attention_impl=pallas", "data.prompt_buckets=[16,24]",
                             "rollout.max_new_tokens=40"])  # fmt: skip


def test_a_tpu_compile_of_the_decode_kernel_is_one_config_line(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m trainer.fit` (tpuops fit) compiles for a TPU: the GPU kernel is refused before any compile."""
    from trainer.fit.__main__ import EXIT_CONFIG, main
    from trainer.sampling.sampler import PALLAS_DECODE_ON_TPU

    argv = ["--config", "tiny", "--accelerator", "v6e-8", "--set", "rollout.attention_impl=pallas"]
    assert (
        main([*argv, "--set", "data.prompt_buckets=[16]", "--set", "rollout.max_new_tokens=16"])
        == EXIT_CONFIG
    )
    err = capsys.readouterr().err.strip()
    assert err == f"config: {PALLAS_DECODE_ON_TPU}" and "\n" not in err
