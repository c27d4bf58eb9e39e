"""The draw on a vocabulary split over the decode's tp group: the whole rows' tokens and log-probs, in two
collectives a position."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

from trainer import sharding
from trainer.sampling.split import BV, SLICE_BV, sample_split
from trainer.sampling.tokens import SamplingConfig, sample_token


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize(
    ("tp", "names", "ways"), [(4, BV, 4), (8, BV, 8), (4, SLICE_BV, 8), (2, SLICE_BV, 8)]
)
def test_the_split_draw_on_a_mesh_is_the_whole_rows_draw(
    greedy: bool, tp: int, names: tuple[str, str], ways: int
) -> None:
    """tp 4 over 2 kv heads (the 3B's decode mesh: tps 2 x tp 2, the vocabulary over both, rows over dp), tp 8
    (the vocabulary 8 ways, every row on every device), and the decode's logits over a slice's every device
    (`SLICE_BV`: tp 4 or 2, dp minor): sample_token's tokens and log-probs for each key."""
    rmesh = sharding.rollout_mesh(sharding.make_mesh(1, 8, 1), tp, kv_heads=2)
    rng = np.random.default_rng(7)
    logits_BV = rng.normal(size=(16, 1536)).astype(np.float32) * 3
    logits_BV[0, 5], logits_BV[0, 1400] = 40.0, 40.0  # a tie across devices: the first goes
    spec = sharding.logical_spec(names, logits_BV.shape, rmesh)
    on_mesh = jax.device_put(logits_BV, NamedSharding(rmesh, spec))
    parts = sharding.vocab_ways(logits_BV.shape[1], rmesh, names[1])
    assert parts == ways
    for temperature in (1.0, 0.7):
        sampling = SamplingConfig(1, temperature=temperature, greedy=greedy)
        draw = jax.jit(lambda x, key, s=sampling: sample_split(x, key, s, parts, rmesh, names))
        for k in range(4):
            want = sample_token(logits_BV, jax.random.key(k), sampling)
            got = draw(on_mesh, jax.random.key(k))
            np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
            np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), atol=1e-5)
        if greedy:
            assert int(got[0][0]) == 5


def test_the_split_draw_crosses_devices_twice() -> None:
    """One all-gather of the blocks' figures and one sum of the drawn token: the compiled draw's collectives."""
    rmesh = sharding.rollout_mesh(sharding.make_mesh(1, 8, 1), 4, kv_heads=2)
    B, V = 16, 1536
    spec = sharding.logical_spec(("batch", "vocab"), (B, V), rmesh)
    like = jax.ShapeDtypeStruct((B, V), np.float32, sharding=NamedSharding(rmesh, spec))
    sampling = SamplingConfig(1, temperature=0.9)
    text = (
        jax.jit(lambda x, key: sample_split(x, key, sampling, 4, rmesh))
        .lower(like, jax.random.key(0))
        .compile()
        .as_text()
    )
    ops = re.findall(
        r"= \S+ (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(?:-start)?\(", text
    )
    assert sorted(ops) == ["all-gather", "all-reduce"], ops
