"""Shared random inputs for the kernel tests: ragged row chunks, ragged vocab tiles, an id in every tile."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# Dims: B batch, T tokens, V vocab (not a multiple of the 128-column tiles), D hidden.
B, T, V, D = 2, 24, 1000, 32
TEMPERATURE = 0.7
TOL = {"float32": 2e-5, "bfloat16": 1e-2}  # max |impl - ref| / max |ref|, as in trainer/gradcheck.py


def draw(seed: int, dtype: str) -> dict[str, jax.Array]:
    """Fresh random draw: logits, hidden, W, ids (one in every 128-column tile), both-sign output weights."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, size=B * T)
    tiles = np.arange(0, V, 128)
    ids[: len(tiles)] = np.minimum(tiles + rng.integers(0, 128, len(tiles)), V - 1)
    return {
        "logits": jnp.asarray(rng.normal(0, 3.0, (B, T, V)), dtype),
        "hidden": jnp.asarray(rng.normal(0, 1.0, (B, T, D)), dtype),
        "w": jnp.asarray(rng.normal(0, 2.0 / np.sqrt(D), (D, V)), dtype),
        "ids": jnp.asarray(rng.permutation(ids).reshape(B, T), jnp.int32),
        "c_logp": jnp.asarray(rng.normal(0, 1.0, (B, T)), jnp.float32),
        "c_ent": jnp.asarray(rng.normal(0, 1.0, (B, T)), jnp.float32),
    }


def rel_err(got: jax.Array, want: jax.Array) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def inputs(request: pytest.FixtureRequest) -> dict[str, jax.Array]:
    x = draw({"float32": 1, "bfloat16": 2}[request.param], request.param)
    x["dtype"] = request.param
    return x
