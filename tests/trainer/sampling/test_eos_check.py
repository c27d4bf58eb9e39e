"""The end-of-sequence test every k decode positions (`rollout.eos_check_every`): the same state as a test after
every position (trainer.fit's count of the positions: tests/trainer/fit/test_eos_check_fit.py)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpy.typing import NDArray

from trainer.config_sections import ConfigError, RolloutConfig
from trainer.model.config import Qwen2Config
from trainer.sampling import sampler
from trainer.sampling.sampler import DecodeState, SamplingConfig, for_rollout

Tiny = tuple[Qwen2Config, Any]  # (config, params pytree): the tiny_f32 fixture
Prompts = tuple[NDArray[np.int32], NDArray[np.int32]]  # (ids_BP, mask_BP): the prompts fixture
PAD = 151_643
NO_EOS = (-1,)
C = 12  # 11 fed positions: 11 % 3 == 2, 11 % 8 == 3; with block=4 the segments feed 4, 4 and 3


def _decode(
    tiny: Tiny, prompts: Prompts, sampling: SamplingConfig, eos: tuple[int, ...], key: int
) -> DecodeState:
    config, params = tiny
    static = sampler.static_args(config, sampling, eos, PAD, None)
    ids, mask = (jnp.asarray(a, jnp.int32) for a in prompts)
    state = sampler._prefill(params, ids, mask, jax.random.key(key), **static)
    out: DecodeState = sampler._decode(params, state, **static)
    return out


def _assert_same_state(got: DecodeState, want: DecodeState) -> None:
    """Every field of the decode state, exactly: tokens, mask, log-probs, done, step, positions, RNG and cache."""
    for name in ("tokens_BC", "mask_BC", "logprobs_BC", "done_B", "positions_B", "step"):
        np.testing.assert_array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), name)
    np.testing.assert_array_equal(
        np.asarray(jax.random.key_data(got.rng)), np.asarray(jax.random.key_data(want.rng))
    )
    for name in ("keys", "values", "mask_BS", "index"):
        np.testing.assert_array_equal(
            np.asarray(getattr(got.cache, name)), np.asarray(getattr(want.cache, name)), f"cache.{name}"
        )


@pytest.mark.slow  # 11-18 s a case: each compiles the decode six times
@pytest.mark.parametrize("layers", ["scan", "unrolled"])
@pytest.mark.parametrize("block", [0, 4])
def test_testing_every_k_positions_gives_the_every_position_state(
    tiny_f32: Tiny, prompts: Prompts, block: int, layers: str
) -> None:
    """Sampled, no EOS (every position runs) and with an EOS every row meets early (the loop stops inside a
    block of k, and the positions after it run for nothing): k = 3 and 8 leave k = 1's state, field for field."""
    every = {k: SamplingConfig(C, 0.8, block=block, layers=layers, eos_every=k) for k in (1, 3, 8)}
    full = _decode(tiny_f32, prompts, every[1], NO_EOS, key=5)
    assert int(full.step) == C - 1
    # Each row's token at column 1 as the EOS: every row is done by position 1 (greedy or not, the same draws
    # up to there), so the loop stops after 2 of its 11 positions.
    eos = tuple(sorted({int(t) for t in np.asarray(full.tokens_BC)[:, 1]}))
    for eos_ids in (NO_EOS, eos):
        want = _decode(tiny_f32, prompts, every[1], eos_ids, key=5)
        if eos_ids != NO_EOS:
            assert int(want.step) <= 1 and bool(np.all(want.done_B))
            assert not np.asarray(want.mask_BC)[:, 2:].any()
        for k in (3, 8):
            _assert_same_state(_decode(tiny_f32, prompts, every[k], eos_ids, key=5), want)


def test_generate_with_every_k_gives_every_positions_outputs(tiny_f32: Tiny, prompts: Prompts) -> None:
    """Through `generate` (what the rollout calls), greedy with rows stopping at different positions: the same
    tokens, mask, log-probs and step count."""
    config, params = tiny_f32
    ids_BP, mask_BP = (jnp.asarray(a, jnp.int32) for a in prompts)
    greedy = SamplingConfig(C, greedy=True)
    ids = np.asarray(
        sampler.generate(
            params, config, ids_BP, mask_BP, jax.random.key(0), greedy, NO_EOS, PAD
        ).completion_ids_BC
    )
    eos = (int(ids[0, 0]), int(ids[1, 4]))  # row 0 stops at once, row 1 by position 4, others maybe later
    outs = [
        sampler.generate(
            params,
            config,
            ids_BP,
            mask_BP,
            jax.random.key(0),
            SamplingConfig(C, greedy=True, eos_every=k),
            eos,
            PAD,
        )
        for k in (1, 3, 8)
    ]
    for out in outs[1:]:
        for name in ("completion_ids_BC", "completion_mask_BC", "logprobs_BC", "steps"):
            np.testing.assert_array_equal(
                np.asarray(getattr(out, name)), np.asarray(getattr(outs[0], name)), name
            )
    assert 4 <= int(outs[0].steps) <= C


def test_the_setting_is_checked_and_reaches_the_sampler() -> None:
    with pytest.raises(ConfigError, match=r"rollout.eos_check_every must be >= 1 .*received 0"):
        RolloutConfig(eos_check_every=0)
    with pytest.raises(ValueError, match=r"eos_every must be >= 1 .*received -2"):
        SamplingConfig(C, eos_every=-2)
    assert RolloutConfig().eos_check_every == 1  # the default: a test after every position
    assert for_rollout(RolloutConfig(eos_check_every=8), "gpu").eos_every == 8
