"""One token from logits: the sampling settings (temperature, top-k, top-p, greedy) and the draw with its
log-probability under the distribution that drew it (Dims: B batch, V vocab)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import Array

from trainer.model.config import DECODE_ATTENTIONS

LAYER_LOOPS = ("scan", "unrolled")


@dataclass(frozen=True)
class SamplingConfig:
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter
    greedy: bool = False
    # Decode positions per attention window: the loop runs in segments of `block` positions, each attending over
    # the cache slots written by its last position only (0: every position attends over the whole cache).
    block: int = 0
    # The decode's layer loop: "scan" (one layer body over the stacked weights and cache) or "unrolled" (one
    # body per layer over per-layer buffers: what XLA:GPU needs to read weights and cache rows without copying
    # them; `layers_for` picks by platform).
    layers: str = "scan"
    # Decode positions between two end-of-sequence checks: the loop's condition (on a GPU, a copy to the host
    # each time) runs once per `eos_every` positions; positions run after every row is done change nothing.
    eos_every: int = 1
    # The decode's attention over the cache: "xla" (attention.attend) or "pallas" (model/decode_attention.py).
    attention: str = "xla"

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, received {self.max_new_tokens}")
        if self.temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 (use greedy=True for argmax), received {self.temperature}"
            )
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, received {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], received {self.top_p}")
        if self.block < 0:
            raise ValueError(f"block must be >= 0 (0 = the whole cache), received {self.block}")
        if self.eos_every < 1:
            raise ValueError(f"eos_every must be >= 1 (1 = every position), received {self.eos_every}")
        if self.attention not in DECODE_ATTENTIONS:
            raise ValueError(
                f"attention must be one of {', '.join(DECODE_ATTENTIONS)}, received {self.attention!r}"
            )
        if self.layers not in LAYER_LOOPS:
            raise ValueError(f"layers must be one of {', '.join(LAYER_LOOPS)}, received {self.layers!r}")


def filter_logits(logits_BV: Array, sampling: SamplingConfig) -> Array:
    """Temperature-scaled float32 logits with everything outside top-k / top-p set to -inf."""
    logits_BV = logits_BV.astype(jnp.float32) / sampling.temperature
    if sampling.top_k > 0:
        kth_B1 = jax.lax.top_k(logits_BV, sampling.top_k)[0][:, -1:]
        logits_BV = jnp.where(logits_BV < kth_B1, -jnp.inf, logits_BV)
    if sampling.top_p < 1.0:
        logits_BV = jnp.where(
            _nucleus(jax.nn.softmax(logits_BV, axis=-1), sampling.top_p), logits_BV, -jnp.inf
        )
    return logits_BV


def _nucleus(probs_BV: Array, top_p: float, iterations: int = 40) -> Array:
    """Mask of the smallest set of most likely tokens whose mass reaches top_p (the top token always).

    The set is {p >= tau} for the largest tau with mass(p >= tau) >= top_p, found by bisection: a few
    dozen fused compare-and-sum passes over V instead of a full sort of V, which costs ~25x more on CPU.
    """
    lo_B1 = jnp.zeros((*probs_BV.shape[:1], 1), jnp.float32)  # mass(p >= lo) >= top_p always holds
    hi_B1 = jnp.max(probs_BV, axis=-1, keepdims=True)  # mass(p >= hi) may or may not reach top_p

    def halve(_: int, bounds: tuple[Array, Array]) -> tuple[Array, Array]:
        lo, hi = bounds
        mid = (lo + hi) / 2
        ok = jnp.sum(jnp.where(probs_BV >= mid, probs_BV, 0.0), axis=-1, keepdims=True) >= top_p
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo_B1, hi_B1 = jax.lax.fori_loop(0, iterations, halve, (lo_B1, hi_B1))
    top_ok = jnp.sum(jnp.where(probs_BV >= hi_B1, probs_BV, 0.0), axis=-1, keepdims=True) >= top_p
    return probs_BV >= jnp.where(top_ok, hi_B1, lo_B1)


def _categorical(rng: Array, logits_BV: Array) -> Array:
    """Inverse-CDF draw: one uniform per row instead of categorical()'s B x V Gumbel noise (~4x faster)."""
    cdf_BV = jnp.cumsum(jax.nn.softmax(logits_BV, axis=-1), axis=-1)
    u_B1 = jax.random.uniform(rng, (*cdf_BV.shape[:1], 1)) * cdf_BV[:, -1:]
    return jnp.minimum(jnp.sum(cdf_BV <= u_B1, axis=-1), logits_BV.shape[-1] - 1)


def sample_token(logits_BV: Array, rng: Array, sampling: SamplingConfig) -> tuple[Array, Array]:
    """(token_B int32, logprob_B float32) drawn from the filtered, temperature-scaled distribution."""
    if sampling.greedy:
        logq_BV = jax.nn.log_softmax(logits_BV.astype(jnp.float32) / sampling.temperature, axis=-1)
        token_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    else:
        filtered_BV = filter_logits(logits_BV, sampling)
        logq_BV = jax.nn.log_softmax(filtered_BV, axis=-1)
        token_B = _categorical(rng, filtered_BV).astype(jnp.int32)
    return token_B, jnp.take_along_axis(logq_BV, token_B[:, None], axis=-1)[:, 0]
