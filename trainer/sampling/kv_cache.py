"""The KV cache: every layer's keys/values for every slot of prompt + completion, stacked over layers.

Dims: L layers, B batch, S = P + C slots (prompt bucket + max new tokens), K kv heads, H head dim.
Fields:
  keys, values      [L, B, S, K, H] each (after RoPE, in the compute dtype): the carry of the model's layer
                    scan, so layer l's decode step writes its one new slot in place and reads row l.
  mask_BS           bool: slot s holds a real token (left-padding slots of the prompt stay False).
  index             int32 scalar: the next slot to write. Prompts are left-padded to the same P, so
                    every sequence writes its t-th new token into the same slot P + t and one index serves
                    the whole batch (a single dynamic_update_slice per layer).
(With `rollout.decode_layers` unrolled, the decode loop carries keys/values as one [1, B, S, K, H] buffer per
layer instead, sampler._decode, and hands them back stacked.)
Attention from a new token sees exactly the slots with mask_BS True, which after the write are the real
prompt tokens and the tokens generated so far: causality comes from the unwritten slots being False.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import flax.struct
import jax
import jax.numpy as jnp
from jax import Array


@flax.struct.dataclass
class KVCache:
    keys: Array  # [L, B, S, K, H]
    values: Array  # [L, B, S, K, H]
    mask_BS: Array
    index: Array

    if TYPE_CHECKING:  # flax.struct.dataclass adds replace(); declared for the type checker only

        def replace(self, **updates: Any) -> KVCache: ...

    @property
    def length(self) -> int:
        return self.keys.shape[2]


def from_prefill(kv: tuple[Array, Array], prompt_mask_BP: Array, length: int) -> KVCache:
    """A cache of `length` slots holding the prompt's keys/values (k_LBPKH, v_LBPKH) in slots [0, P);
    index = P."""
    P = prompt_mask_BP.shape[1]
    pad = [(0, 0), (0, 0), (0, length - P), (0, 0), (0, 0)]
    mask_BS = jnp.pad(prompt_mask_BP.astype(bool), [(0, 0), (0, length - P)])
    k_LBPKH, v_LBPKH = kv
    return KVCache(jnp.pad(k_LBPKH, pad), jnp.pad(v_LBPKH, pad), mask_BS, jnp.int32(P))


def mark_written(cache: KVCache, width: int = 1) -> KVCache:
    """Mark slots [index, index + width) as holding real tokens (before attending from them)."""
    B = cache.mask_BS.shape[0]
    mask_BS = jax.lax.dynamic_update_slice_in_dim(
        cache.mask_BS, jnp.ones((B, width), bool), cache.index, axis=1
    )
    return cache.replace(mask_BS=mask_BS)
