"""Self-attention of the update and the prefill through `jax.nn.dot_product_attention` (`train.attention_impl:
cudnn`): cuDNN's fused flash-attention kernel on a GPU, no [T, S] float32 scores in HBM, forward and backward.

Dims as trainer/model/qwen2.py's. The same boolean masks as the xla path (`qwen2.causal_mask`, the grouped
forward's [B, C, P + C]) go in as `mask` (cuDNN adds them as a bf16 bias). Each query also sees its own key: a
real query sees it anyway (causal, and its own token is real), and a padding query that sees no real key (left
padding) gets a finite row from its own key instead of a row masked everywhere, whose value would then depend
on the kernel (`attention.attend` gives it the uniform mean; padding rows never reach a real token and carry no
loss, as flash.py's docstring says). The group's prompt is repeated to its G rows before the kernel (cuDNN
takes keys per row): G x the prompt's keys and values, a few MB a layer, against the [G, C, P] scores the xla
path writes.

Off a GPU the call runs jax's XLA implementation of the same function (what the CPU tests check: the masks, the
grouping, the query-per-kv-head layout); a TPU runs splash (`flash.py`) and refuses cudnn (`flash.resolve`).
cuDNN's own limits (head dim at most 256 and a multiple of 8; with a bias, even query and key lengths in
training) are checked by the config (even lengths) and by jax when the update compiles.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax import Array

from trainer.kernels.logprob.blocks import on_gpu


def backend() -> Literal["xla", "cudnn"]:
    """jax.nn.dot_product_attention's implementation here: cudnn where kernels are built for a GPU (this process's
    devices, or a GPU compile target: `compile_target("gpu NVIDIA H200")`, bench/device_aot.py), else xla (the same
    call's reference)."""
    return "cudnn" if on_gpu() else "xla"


def attend_fused(q_BTNH: Array, k_BSKH: Array, v_BSKH: Array, mask_BTS: Array) -> Array:
    """`attention.attend` for queries that are the last T of S keys (T == S: self-attention): the same outputs
    for every query with a visible key; a query with none sees its own key (module docstring) -> [B, T, N, H]."""
    T, S = q_BTNH.shape[1], k_BSKH.shape[1]
    own_TS = jnp.eye(T, S, k=S - T, dtype=bool)
    out = jax.nn.dot_product_attention(
        q_BTNH, k_BSKH.astype(q_BTNH.dtype), v_BSKH.astype(q_BTNH.dtype),
        mask=(mask_BTS.astype(bool) | own_TS[None])[:, None], implementation=backend(),
    )  # fmt: skip
    return out.astype(q_BTNH.dtype)


def attend_fused_shared_prompt(
    q_BCNH: Array, kp_UPKH: Array, vp_UPKH: Array, kc_BCKH: Array, vc_BCKH: Array, mask_BCS: Array
) -> Array:
    """`attention.attend_shared_prompt` for a group's completions (rows u*G .. u*G + G - 1 share prompt u):
    each row's keys are its group's prompt, then its own completion; `mask_BCS` is [B, C, P + C] as the xla
    path's -> [B, C, N, H]."""
    G = q_BCNH.shape[0] // kp_UPKH.shape[0]
    k_BSKH = jnp.concatenate([jnp.repeat(kp_UPKH, G, axis=0), kc_BCKH.astype(kp_UPKH.dtype)], axis=1)
    v_BSKH = jnp.concatenate([jnp.repeat(vp_UPKH, G, axis=0), vc_BCKH.astype(vp_UPKH.dtype)], axis=1)
    return attend_fused(q_BCNH, k_BSKH, v_BSKH, mask_BCS)
