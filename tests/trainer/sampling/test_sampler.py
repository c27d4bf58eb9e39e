"""The while_loop sampler: greedy equals uncached argmax, top-k/top-p/temperature, EOS, compile once."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer.model import qwen2
from trainer.sampling.sampler import (
    SamplingConfig,
    _prefill,
    generate,
    segments,
    static_args,
)
from trainer.sampling.split import sample_split
from trainer.sampling.tokens import filter_logits, sample_token

PAD = 151_643
NO_EOS = (-1,)  # no real token id: sequences run to max_new_tokens
C = 6


def _greedy_without_cache(
    config: object, params: dict, ids_BP: np.ndarray, mask_BP: np.ndarray
) -> np.ndarray:
    """Step-by-step argmax of full forwards over a growing (right-extended) sequence, no KV cache."""
    B, P = ids_BP.shape
    ids = np.concatenate([ids_BP, np.full((B, C), PAD, np.int32)], axis=1)
    mask = np.concatenate([mask_BP, np.zeros((B, C), np.int32)], axis=1)
    for t in range(C):
        pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        logits = qwen2.forward_logits(params, config, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(mask))
        ids[:, P + t] = np.asarray(logits[:, P + t - 1]).argmax(-1)
        mask[:, P + t] = 1
    return ids[:, P:]


@pytest.fixture(scope="module")
def greedy_out(tiny_f32: tuple, prompts: tuple) -> object:
    config, params = tiny_f32
    return generate(params, config, *prompts, jax.random.key(0), SamplingConfig(C, greedy=True), NO_EOS, PAD)


def test_greedy_equals_uncached_argmax(tiny_f32: tuple, prompts: tuple, greedy_out: object) -> None:
    config, params = tiny_f32
    expected = _greedy_without_cache(config, params, *prompts)
    np.testing.assert_array_equal(np.asarray(greedy_out.completion_ids_BC), expected)
    np.testing.assert_array_equal(np.asarray(greedy_out.completion_mask_BC), np.ones_like(expected))
    np.testing.assert_array_equal(np.asarray(greedy_out.prompt_ids_BP), prompts[0])
    assert len(set(expected.ravel().tolist())) > 3  # the random model does not just repeat one token


@pytest.mark.parametrize("sampling", [SamplingConfig(C, top_k=1), SamplingConfig(C, top_p=1e-6)], ids=str)
def test_top_k_1_and_tiny_top_p_equal_greedy(
    tiny_f32: tuple, prompts: tuple, greedy_out: object, sampling: SamplingConfig
) -> None:
    config, params = tiny_f32
    out = generate(params, config, *prompts, jax.random.key(1), sampling, NO_EOS, PAD)
    np.testing.assert_array_equal(np.asarray(out.completion_ids_BC), np.asarray(greedy_out.completion_ids_BC))
    np.testing.assert_allclose(np.asarray(out.logprobs_BC), 0.0, atol=1e-6)  # a one-token distribution


def test_eos_stops_each_sequence_and_exits_early(tiny_f32: tuple, prompts: tuple, greedy_out: object) -> None:
    config, params = tiny_f32
    greedy = np.asarray(greedy_out.completion_ids_BC)
    # row 0 stops at its first token, the others by their second: the loop must stop after 2 positions
    eos = (int(greedy[0, 0]), int(greedy[1, 1]), int(greedy[2, 1]), int(greedy[3, 1]))
    assert eos[0] not in greedy[1:, 0]
    out = generate(params, config, *prompts, jax.random.key(0), SamplingConfig(C, greedy=True), eos, PAD)
    ids, mask = np.asarray(out.completion_ids_BC), np.asarray(out.completion_mask_BC)
    first_eos = [int(np.flatnonzero(np.isin(row, eos))[0]) for row in greedy]
    for b, stop in enumerate(first_eos):
        np.testing.assert_array_equal(ids[b, : stop + 1], greedy[b, : stop + 1])
        np.testing.assert_array_equal(mask[b], (np.arange(C) <= stop).astype(np.int32))
        np.testing.assert_array_equal(ids[b, stop + 1 :], PAD)
        np.testing.assert_array_equal(np.asarray(out.logprobs_BC)[b, stop + 1 :], 0.0)
    assert int(out.steps) == max(first_eos) + 1 < C


@pytest.mark.parametrize("block", [1, 2, 4])
def test_attention_over_each_segments_window_gives_the_masked_paths_tokens(
    tiny_f32: tuple, prompts: tuple, greedy_out: object, block: int
) -> None:
    """Reading only the slots a position can see (segments of `block` positions, one window each) changes no
    token and no log-prob: the masked path's exact output, greedy and sampled."""
    config, params = tiny_f32
    windowed = generate(
        params, config, *prompts, jax.random.key(0), SamplingConfig(C, greedy=True, block=block), NO_EOS, PAD
    )
    np.testing.assert_array_equal(
        np.asarray(windowed.completion_ids_BC), np.asarray(greedy_out.completion_ids_BC)
    )
    np.testing.assert_allclose(
        np.asarray(windowed.logprobs_BC), np.asarray(greedy_out.logprobs_BC), atol=1e-5
    )
    masked, sampled = (
        generate(params, config, *prompts, jax.random.key(5), SamplingConfig(C, 0.8, block=b), NO_EOS, PAD)
        for b in (0, block)
    )
    np.testing.assert_array_equal(np.asarray(sampled.completion_ids_BC), np.asarray(masked.completion_ids_BC))
    np.testing.assert_allclose(np.asarray(sampled.logprobs_BC), np.asarray(masked.logprobs_BC), atol=1e-5)


def test_early_exit_across_segments_gives_the_full_runs_outputs(
    tiny_f32: tuple, prompts: tuple, greedy_out: object
) -> None:
    """Every row stops by position 2: the first segment ends the loop, the later ones run no position, and the
    output is the full-length run's cut at each row's EOS (pad and mask 0 after it)."""
    config, params = tiny_f32
    greedy = np.asarray(greedy_out.completion_ids_BC)
    eos = tuple(int(t) for t in greedy[:, 1])
    out = generate(
        params, config, *prompts, jax.random.key(0), SamplingConfig(C, greedy=True, block=3), eos, PAD
    )
    stops = [int(np.flatnonzero(np.isin(row, eos))[0]) for row in greedy]
    keep = np.arange(C)[None, :] <= np.asarray(stops)[:, None]
    np.testing.assert_array_equal(np.asarray(out.completion_ids_BC), np.where(keep, greedy, PAD))
    np.testing.assert_array_equal(np.asarray(out.completion_mask_BC), keep.astype(np.int32))
    np.testing.assert_allclose(
        np.asarray(out.logprobs_BC), np.where(keep, np.asarray(greedy_out.logprobs_BC), 0.0), atol=1e-5
    )
    assert int(out.steps) == max(stops) + 1 <= 2 < C


@pytest.mark.parametrize("block", [0, 2])
def test_the_unrolled_layer_loop_gives_the_scans_tokens_and_logprobs(
    tiny_f32: tuple, prompts: tuple, greedy_out: object, block: int
) -> None:
    """The decode over per-layer weights and caches (`layers="unrolled"`, GPU's choice) against the layer scan:
    the same tokens and log-probs, greedy and sampled, over the whole cache and in windowed segments, and with
    an early exit (every row stops by position 2); the returned cache is stacked again, as the scan's."""
    config, params = tiny_f32
    greedy = np.asarray(greedy_out.completion_ids_BC)
    eos = tuple(int(t) for t in greedy[:, 1])
    for key, kw, eos_ids in ((0, {"greedy": True}, NO_EOS), (5, {"temperature": 0.8}, NO_EOS),
                             (0, {"greedy": True}, eos)):  # fmt: skip
        scan, unrolled = (
            generate(params, config, *prompts, jax.random.key(key), sampling, eos_ids, PAD)
            for sampling in (SamplingConfig(C, block=block, layers=lay, **kw) for lay in ("scan", "unrolled"))
        )
        np.testing.assert_array_equal(
            np.asarray(unrolled.completion_ids_BC), np.asarray(scan.completion_ids_BC)
        )
        np.testing.assert_array_equal(
            np.asarray(unrolled.completion_mask_BC), np.asarray(scan.completion_mask_BC)
        )
        np.testing.assert_allclose(np.asarray(unrolled.logprobs_BC), np.asarray(scan.logprobs_BC), atol=1e-5)
        assert int(unrolled.steps) == int(scan.steps)
    assert int(unrolled.steps) <= 2 < C  # the last pair stopped early
    np.testing.assert_array_equal(greedy, np.asarray(
        generate(params, config, *prompts, jax.random.key(0), SamplingConfig(C, greedy=True, layers="unrolled"),
                 NO_EOS, PAD).completion_ids_BC))  # fmt: skip


def test_the_unrolled_decode_hands_back_the_scans_stacked_cache(tiny_f32: tuple, prompts: tuple) -> None:
    """After the loop the per-layer caches are stacked again: the same [L, B, S, K, H] keys and values as the
    scan's, slot for slot."""
    from trainer.sampling import sampler

    config, params = tiny_f32
    out = []
    for layers in ("scan", "unrolled"):
        static = sampler.static_args(config, SamplingConfig(C, greedy=True, layers=layers), NO_EOS, PAD, None)
        ids, mask = (jnp.asarray(a, jnp.int32) for a in prompts)
        state = sampler._prefill(params, ids, mask, jax.random.key(0), **static)
        out.append(sampler._decode(params, state, **static).cache)
    assert out[1].keys.shape == out[0].keys.shape == (config.num_hidden_layers, *out[0].keys.shape[1:])
    np.testing.assert_allclose(np.asarray(out[1].keys), np.asarray(out[0].keys), atol=1e-6)
    np.testing.assert_allclose(np.asarray(out[1].values), np.asarray(out[0].values), atol=1e-6)


def test_the_layer_loop_is_chosen_by_platform() -> None:
    from trainer.sampling.sampler import layers_for

    assert layers_for("auto", "gpu") == "unrolled"
    assert layers_for("auto", "tpu") == layers_for("auto", "cpu") == "scan"
    assert layers_for("unrolled", "tpu") == "unrolled" and layers_for("scan", "gpu") == "scan"
    with pytest.raises(ValueError, match="auto, scan or unrolled, received 'loop'"):
        layers_for("loop", "cpu")
    with pytest.raises(ValueError, match="layers must be one of scan, unrolled, received 'auto'"):
        SamplingConfig(4, layers="auto")


@pytest.mark.parametrize("tp", [2, 4])
def test_decode_layouts_up_to_twice_the_kv_heads_give_the_single_devices_tokens(
    tiny_f32: tuple, prompts: tuple, greedy_out: object, tp: int
) -> None:
    """The decode layout over 8 devices with `rollout.tp` = the kv-head count (2, the automatic choice) and twice
    it (4: each kv head's query heads split over two devices, the 3B presets' layout): the single device's
    tokens, greedy, and its log-probs."""
    from trainer.layout import decode_layout
    from trainer.sharding import make_mesh, shard_params

    config, params = tiny_f32
    assert config.num_key_value_heads == 2 and config.num_attention_heads % tp == 0
    mesh = make_mesh(dp=1, fsdp=8, tp=1)
    rmesh, to_decode = decode_layout(mesh, config, params, tp)
    pairs = {"tps": 2, "tp": 2} if tp == 4 else {"tp": tp}  # 2 kv heads: tp 4 is 2 heads x 2 sequence splits
    assert dict(rmesh.shape) == {"dcn": 1, "dp": 8 // tp, "fsdp": 1, **pairs}
    on_mesh = to_decode(shard_params(params, mesh))
    for layers in ("scan", "unrolled"):  # the unrolled loop keeps the layout: per-layer caches split alike
        sampling = SamplingConfig(C, greedy=True, layers=layers)
        out = generate(on_mesh, config, *prompts, jax.random.key(0), sampling, NO_EOS, PAD, mesh=rmesh)
        assert len(out.completion_ids_BC.sharding.device_set) == 8
        np.testing.assert_array_equal(
            np.asarray(out.completion_ids_BC), np.asarray(greedy_out.completion_ids_BC)
        )
        np.testing.assert_allclose(np.asarray(out.logprobs_BC), np.asarray(greedy_out.logprobs_BC), atol=1e-5)


@pytest.mark.parametrize("greedy", [True, False])
def test_sampling_on_vocabulary_blocks_draws_what_whole_rows_draw(greedy: bool) -> None:
    """sample_split (the vocabulary left in tp blocks) against sample_token on whole rows: the same tokens and
    log-probs over 1,600 draws, ties going to the first maximum as argmax does."""
    rng = np.random.default_rng(4)
    logits_BV = jnp.asarray(rng.normal(size=(80, 1200)).astype(np.float32) * 3)
    logits_BV = logits_BV.at[0, 7].set(50.0).at[0, 1000].set(50.0)  # a tie across blocks
    for parts, temperature in ((2, 1.0), (4, 0.7), (8, 1.3)):
        sampling = SamplingConfig(1, temperature=temperature, greedy=greedy)
        for k in range(5):
            want = sample_token(logits_BV, jax.random.key(k), sampling)
            got = sample_split(logits_BV, jax.random.key(k), sampling, parts)
            np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
            np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), atol=1e-5)
        if greedy:
            assert int(got[0][0]) == 7


def test_segments_cover_every_fed_position_once() -> None:
    assert segments(6, 0) == [(0, 5)] and segments(6, 2) == [(0, 2), (2, 4), (4, 5)]
    assert segments(1024, 256) == [(0, 256), (256, 512), (512, 768), (768, 1023)] and segments(1, 4) == []


def test_filters_keep_exactly_the_right_tokens() -> None:
    logits_BV = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]]))
    kept = lambda s: np.isfinite(np.asarray(filter_logits(logits_BV, s)))  # noqa: E731
    np.testing.assert_array_equal(kept(SamplingConfig(1, top_k=2)), [[1, 1, 0, 0], [0, 0, 1, 1]])
    np.testing.assert_array_equal(kept(SamplingConfig(1, top_p=0.7)), [[1, 1, 0, 0], [0, 0, 1, 1]])
    np.testing.assert_array_equal(kept(SamplingConfig(1, top_p=0.81)), [[1, 1, 1, 0], [0, 1, 1, 1]])
    hot = filter_logits(logits_BV, SamplingConfig(1, temperature=2.0))
    np.testing.assert_allclose(np.asarray(hot), np.asarray(logits_BV) / 2.0, rtol=1e-6)


def test_temperature_shapes_the_sampled_distribution() -> None:
    logits_BV = jnp.tile(jnp.log(jnp.array([[0.6, 0.3, 0.1]])), (20_000, 1))
    for temperature in (0.5, 1.0, 2.0):
        tokens, logprobs = sample_token(
            logits_BV, jax.random.key(3), SamplingConfig(1, temperature=temperature)
        )
        target = np.array([0.6, 0.3, 0.1]) ** (1 / temperature)
        target /= target.sum()
        freq = np.bincount(np.asarray(tokens), minlength=3) / 20_000
        np.testing.assert_allclose(freq, target, atol=0.015)
        np.testing.assert_allclose(np.asarray(logprobs), np.log(target)[np.asarray(tokens)], atol=1e-5)


def test_sampled_logprobs_match_a_full_forward_and_compile_once(
    tiny_f32: tuple, prompts: tuple, caplog: pytest.LogCaptureFixture
) -> None:
    """10 calls, different prompts, one bucket: prefill and decode compile once; logprobs are exact."""
    config, params = tiny_f32
    sampling = SamplingConfig(C - 1, temperature=0.7)  # a shape/config no other test compiled
    rng = np.random.default_rng(11)
    caplog.set_level(logging.WARNING)
    with jax.log_compiles(True):
        outs = []
        for i in range(10):
            ids = rng.integers(0, 151_665, size=prompts[0].shape).astype(np.int32)
            outs.append(
                (ids, generate(params, config, ids, prompts[1], jax.random.key(i), sampling, NO_EOS, PAD))
            )
    compiled = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling ")]
    assert sum(m.startswith("Compiling jit(_prefill)") for m in compiled) == 1, compiled
    assert sum(m.startswith("Compiling jit(_decode)") for m in compiled) == 1, compiled

    ids, out = outs[-1]
    full_ids = np.concatenate([ids, np.asarray(out.completion_ids_BC)], axis=1)
    full_mask = np.concatenate([prompts[1], np.ones_like(out.completion_ids_BC)], axis=1)
    pos = np.maximum(np.cumsum(full_mask, axis=1) - 1, 0)
    logits = qwen2.forward_logits(
        params, config, jnp.asarray(full_ids), jnp.asarray(pos), jnp.asarray(full_mask)
    )
    P = ids.shape[1]
    logq = jax.nn.log_softmax(np.asarray(logits[:, P - 1 : -1]) / 0.7, axis=-1)
    expected = np.take_along_axis(np.asarray(logq), full_ids[:, P:, None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.logprobs_BC), expected, atol=2e-4)
    assert len({tuple(np.asarray(o.completion_ids_BC[0]).tolist()) for _, o in outs}) == 10


def test_sampling_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="received 0"):
        SamplingConfig(0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(4, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(4, temperature=0.0)
    with pytest.raises(ValueError, match="block"):
        SamplingConfig(4, block=-1)


def _same_draws(a: object, b: object) -> None:
    """The same tokens and log-probs from two programs whose logits differ by float32 rounding (about 1e-6): a
    draw whose uniform lands within that of a step of the cumulative distribution takes the neighbouring token id
    in one of them, and its row runs on from there with its own context. At most one row may part so, by one id;
    every row matches up to where it parts."""
    ta, tb = np.asarray(a.completion_ids_BC), np.asarray(b.completion_ids_BC)
    la, lb = np.asarray(a.logprobs_BC), np.asarray(b.logprobs_BC)
    parted = 0
    for r in range(len(ta)):
        differ = np.flatnonzero(ta[r] != tb[r])
        upto = int(differ[0]) if differ.size else ta.shape[1]
        np.testing.assert_array_equal(ta[r, :upto], tb[r, :upto])
        np.testing.assert_allclose(la[r, :upto], lb[r, :upto], atol=1e-5)
        if differ.size:
            parted += 1
            assert abs(int(ta[r, upto]) - int(tb[r, upto])) == 1, (r, upto, ta[r], tb[r])
    assert parted <= 1, (ta, tb)


@pytest.mark.parametrize("tp", [0, 4])
def test_each_prompt_is_prefilled_and_read_once_per_group_and_every_sample_draws_its_own_tokens(
    tiny_f32: tuple, prompts: tuple, tp: int
) -> None:
    """generate(samples=G) over G copies of each prompt (as the rollout repeats them) against samples=1 over the
    same rows: the same tokens and log-probs, sampled at temperature 1 with the same key; on one device (the scan
    and the unrolled layer loop, with and without attention windows) and on the decode layout over 8 devices
    (4 prompts x 4 over a batch split 4 ways; 2 x 4 where the prompts do not split as the rows do). The G rows of a
    prompt draw different completions; rows not in groups of G are refused; the prefill costs a G-th of the
    model's FLOPs. (What the decode no longer reads is measured on the TPU compile: docs/performance.md.)"""
    from trainer.layout import decode_layout
    from trainer.sharding import make_mesh, shard_params

    config, params = tiny_f32
    variants = [SamplingConfig(C, temperature=1.0)]
    on, kw = params, {}
    if tp:
        rmesh, to_decode = decode_layout(make_mesh(dp=1, fsdp=8, tp=1), config, params, tp)
        on, kw = to_decode(shard_params(params, make_mesh(dp=1, fsdp=8, tp=1))), {"mesh": rmesh}
    else:
        variants += [
            SamplingConfig(C, temperature=1.0, block=2),
            SamplingConfig(C, temperature=1.0, layers="unrolled"),
        ]
    # 4 prompts x 4 in every variant; on the decode layout also 2 x 4 (prompts that do not split over the batch's 4
    # ways; on one device nothing is split, and it would be two more compiles of the same programs)
    shapes = [((4, 4), v) for v in variants] + ([((2, 4), variants[0])] if tp else [])
    for (n_prompts, G), sampling in shapes:
        ids, mask = (np.repeat(x[:n_prompts], G, axis=0) for x in prompts)
        every = generate(on, config, ids, mask, jax.random.key(5), sampling, NO_EOS, PAD, **kw)
        once = generate(on, config, ids, mask, jax.random.key(5), sampling, NO_EOS, PAD, **kw, samples=G)
        _same_draws(once, every)
        np.testing.assert_array_equal(np.asarray(once.prompt_ids_BP), ids)
        tokens = np.asarray(once.completion_ids_BC).reshape(n_prompts, G, C)
        assert all(len({tuple(row) for row in group}) > 1 for group in tokens)  # each sample its own draw
    with pytest.raises(ValueError, match=f"samples must be >= 1 and divide the {len(ids)} rows, received 3"):
        generate(params, config, ids, mask, jax.random.key(5), variants[0], NO_EOS, PAD, samples=3)
    if (
        not tp
    ):  # the model ran on one row per group (tiny model, 8-token prompts: the draws are a third of it)
        flops = []
        for g in (1, G):
            static = static_args(config, variants[0], NO_EOS, PAD, None, g)
            flops.append(
                _prefill.lower(params, ids, mask, jax.random.key(5), **static).compile().cost_analysis()
            )
        assert flops[1]["flops"] < flops[0]["flops"] / 2, flops
