"""Loss kernels behind one interface: pick an implementation by name (`train.loss_impl`) or `auto`.

Dims: B batch, T tokens, V vocab, D hidden. Every implementation returns float32 [B, T] log-probs and
entropies and is differentiable w.r.t. the logits (or hidden states and LM-head weight) through both outputs.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import Array

from trainer.kernels.ce import reference as ce_reference
from trainer.kernels.logprob import chunked, fused_lm_head, pallas_lm_head, pallas_tpu, reference
from trainer.kernels.sharded import batch_sharded

IMPLS = ("reference", "chunked", "pallas", "fused_lm_head")

# Measured choice per backend (docs/performance.md): on CPU `chunked` is within noise of the
# reference's time at a fraction of its memory; on TPU the Pallas kernel; on GPU `chunked` (no GPU Pallas
# kernel beats it, none is shipped).
AUTO = {"cpu": "chunked", "gpu": "chunked", "cuda": "chunked", "rocm": "chunked", "tpu": "pallas"}

# name -> fn(logits_BTV, ids_BT, temperature) -> (logp_BT, entropy_BT). `fused_lm_head` has no logits
# form: given logits it is the chunked kernel (its saving needs the hidden states).
LOGITS_IMPLS: dict[str, Callable[[Array, Array, float], tuple[Array, Array]]] = {
    "reference": lambda z, ids, t: reference.token_logprob_entropy(z, ids, temperature=t),
    "chunked": lambda z, ids, t: chunked.token_logprob_entropy(z, ids, temperature=t),
    "pallas": lambda z, ids, t: pallas_tpu.token_logprob_entropy(z, ids, temperature=t),
    "fused_lm_head": lambda z, ids, t: chunked.token_logprob_entropy(z, ids, temperature=t),
}
HIDDEN_IMPLS: dict[str, Callable[[Array, Array, Array, float], tuple[Array, Array]]] = {
    "fused_lm_head": lambda h, w, ids, t: fused_lm_head.token_logprob_entropy_from_hidden(
        h, w, ids, temperature=t
    ),
    # Pallas statistics over float32 logits one row chunk at a time (never [B, T, V] in float32).
    "pallas": lambda h, w, ids, t: pallas_lm_head.token_logprob_entropy_from_hidden(h, w, ids, temperature=t),
}


def resolve_impl(name: str, backend: str | None = None) -> str:
    """The implementation `name` stands for on `backend` (default: JAX's): `auto` -> the measured choice."""
    if name == "auto":
        return AUTO.get(backend or jax.default_backend(), "chunked")
    if name not in IMPLS:
        raise ValueError(f"loss impl must be one of {(*IMPLS, 'auto')}, received {name!r}")
    return name


def token_logprob_entropy(
    logits_BTV: Array, ids_BT: Array, *, temperature: float = 1.0, impl: str = "chunked"
) -> tuple[Array, Array]:
    """(log p(ids), entropy) of softmax(logits / temperature), float32 [B, T] each."""
    if logits_BTV.shape[:-1] != ids_BT.shape:
        raise ValueError(f"logits [B, T, V] and ids [B, T] disagree: {logits_BTV.shape} vs {ids_BT.shape}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, received {temperature}")
    return LOGITS_IMPLS[resolve_impl(impl)](logits_BTV, ids_BT, temperature)


def token_logprob_entropy_from_hidden(
    hidden_BTD: Array, w_DV: Array, ids_BT: Array, *, temperature: float = 1.0, impl: str = "fused_lm_head"
) -> tuple[Array, Array]:
    """The same from hidden states and the LM-head weight; `fused_lm_head` and `pallas` never build [B, T, V]
    float32 logits. Under a mesh in context the kernel runs per device on its batch rows (kernels.sharded)."""
    name = resolve_impl(impl)
    if hidden_BTD.shape[:-1] != ids_BT.shape:
        raise ValueError(f"hidden [B, T, D] and ids [B, T] disagree: {hidden_BTD.shape} vs {ids_BT.shape}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, received {temperature}")
    if name in HIDDEN_IMPLS:
        hidden_impl = HIDDEN_IMPLS[name]
    else:
        logits_impl = LOGITS_IMPLS[name]

        def hidden_impl(h: Array, w: Array, ids: Array, t: float) -> tuple[Array, Array]:
            return logits_impl(h @ w, ids, t)

    return batch_sharded(lambda h, w, ids: hidden_impl(h, w, ids, temperature), hidden_BTD, w_DV, ids_BT)


def _masked_mean_nll(logp_BT: Array, mask_BT: Array) -> Array:
    mask_BT = mask_BT.astype(jnp.float32)
    return -jnp.sum(logp_BT * mask_BT) / jnp.maximum(jnp.sum(mask_BT), 1.0)


def cross_entropy(logits_BTV: Array, labels_BT: Array, mask_BT: Array, *, impl: str = "chunked") -> Array:
    """Mean over `mask` of -log softmax(logits)[label], a float32 scalar."""
    if resolve_impl(impl) == "reference":
        return ce_reference.cross_entropy(logits_BTV, labels_BT, mask_BT)
    logp_BT, _ = token_logprob_entropy(logits_BTV, labels_BT, impl=impl)
    return _masked_mean_nll(logp_BT, mask_BT)


def cross_entropy_from_hidden(
    hidden_BTD: Array, w_DV: Array, labels_BT: Array, mask_BT: Array, *, impl: str = "fused_lm_head"
) -> Array:
    """Cross-entropy from hidden states and the LM-head weight (see `token_logprob_entropy_from_hidden`)."""
    if resolve_impl(impl) == "reference":
        return ce_reference.cross_entropy(hidden_BTD @ w_DV, labels_BT, mask_BT)
    logp_BT, _ = token_logprob_entropy_from_hidden(hidden_BTD, w_DV, labels_BT, impl=impl)
    return _masked_mean_nll(logp_BT, mask_BT)
