"""The Qwen2 decoder layer's parts as Flax linen modules: RMSNorm, the attention block (projections, RoPE, attention
over its own keys, a KV cache or a group's prompt, the output projection) and the MLP. Dims as trainer/model/qwen2.py's."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import Array

from trainer.model.attention import (
    apply_rope,
    attend,
    attend_shared_prompt,
    completion_slots,
    group_prompt,
)
from trainer.model.config import Qwen2Config
from trainer.model.decode_attention import decode_attention
from trainer.model.flash import attend_flash, attend_flash_after_prompt
from trainer.model.fused import attend_fused, attend_fused_shared_prompt
from trainer.sharding import TP_SEQ_AXIS, constrain, constrain_cache, constrain_sequences, heads_split

# Logical axis names of the activations (trainer.sharding.LOGICAL maps them to mesh axes).
BTD = ("batch", "length", "embed")
BTNH = ("batch", "length", "heads", "head_dim")
BTKH = ("batch", "length", "kv_heads", "head_dim")
BTKPH = ("batch", "length", "kv_heads", None, "head_dim")  # the fused q|k|v: [B, T, K, G + 2, H]
BTF = ("batch", "length", "mlp")
RTD = ("residual", "length", "embed")  # the rollout's residual stream (trainer.sharding.LOGICAL)


def residual_rows() -> tuple[str, ...]:
    """The residual stream's logical names under the mesh in context: in a rollout mesh whose tp group is kv heads x
    sequences (trainer.sharding.TP_SEQ_AXIS) its rows split over the whole group, so each matmul's partial sums
    are reduce-scattered and its input rows gathered (on a v6e-8 2x2 group, 3 hops a layer fewer than all-reducing
    the attention's output over tp, gathering it over the sequences and all-reducing the MLP's over all four);
    elsewhere the batch's."""
    return RTD if TP_SEQ_AXIS in jax.sharding.get_abstract_mesh().axis_names else BTD


def dt(name: str) -> jnp.dtype:
    return jnp.dtype(name)


class RMSNorm(nn.Module):
    eps: float
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x_BTD: Array) -> Array:
        scale = self.param("scale", nn.initializers.ones, (x_BTD.shape[-1],), self.param_dtype)
        x = x_BTD.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return (scale.astype(jnp.float32) * x).astype(self.dtype)


class Attention(nn.Module):
    config: Qwen2Config
    fused: bool = False  # q|k|v as one weight and one matmul (the decode layout); else HF's three

    def _dense(self, features: int | tuple[int, ...], bias: bool, name: str) -> nn.DenseGeneral:
        c = self.config
        init = nn.initializers.normal(c.initializer_range)
        # Non-zero bias init so that tests exercise the q/k/v biases (HF initialises them to zero).
        return nn.DenseGeneral(
            features, use_bias=bias, dtype=dt(c.dtype), param_dtype=dt(c.param_dtype),
            kernel_init=init, bias_init=init, name=name,
        )  # fmt: skip

    @nn.compact
    def __call__(self, x_BTD: Array, cos_BTH: Array, sin_BTH: Array, mask_BTS: Any, kv: Any) -> Any:
        """`kv` None: attend over this call's own keys (mask_BTS is [B, T, T]; or the attention mask [B, T], which
        selects the Pallas kernel: `self_mask`) and return them; else
        (keys_LBSKH, values_LBSKH, layer, slot, window, prompt, samples): write the new keys/values at (`layer`,
        `slot`) of the whole stacked cache, in place, attend over this layer's first `window` slots (0: all S;
        mask_BTS is [B, T, S]) and return the updated stacked cache. With `samples` G > 1 the rows come in groups
        of G samples of one prompt whose first `prompt` slots are the same in each group (the prefill wrote them
        so): those are read from each group's first row only (`attend_shared_prompt`).
        `mask_BTS` a tuple, with `kv` None: each row is a group [prompt, its completions] (`attend_grouped`)."""
        c = self.config
        B, T, _ = x_BTD.shape
        N, K, H = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        G = N // K
        if self.fused:  # one matmul: each kv head's G query heads, then its key and value (model/fusion.py)
            qkv = constrain(self._dense((K, G + 2, H), True, "qkv_proj")(x_BTD), *BTKPH)
            q = constrain(qkv[:, :, :, :G].reshape(B, T, N, H), *BTNH)
            k, v = (constrain(qkv[:, :, :, G + i], *BTKH) for i in (0, 1))
        else:  # Hugging Face's three projections (the training layout)
            q = constrain(self._dense(N * H, True, "q_proj")(x_BTD).reshape(B, T, N, H), *BTNH)
            k = constrain(self._dense(K * H, True, "k_proj")(x_BTD).reshape(B, T, K, H), *BTKH)
            v = constrain(self._dense(K * H, True, "v_proj")(x_BTD).reshape(B, T, K, H), *BTKH)
        mesh = jax.sharding.get_abstract_mesh()
        by_sequence = kv is not None and not mesh.empty and not heads_split(K, mesh)
        if by_sequence:
            # The cache is split by sequence over tp too (trainer.sharding.heads_split): each device attends
            # for its own sequences with every head. The queries cross tp by one all-to-all in their own dtype,
            # before RoPE (after it, XLA moved them as two float32 halves of RoPE's rotation); the output by one.
            q = constrain_sequences(q)
        # The Pallas kernel takes queries scaled by 1 / sqrt(H): folded into RoPE's float32 tables, not a pass of its own.
        scaled = kv is None and (mask_BTS[2] if isinstance(mask_BTS, tuple) else mask_BTS).ndim == 2
        qs = (1.0 / H**0.5) if scaled else 1.0
        q, k = apply_rope(q, cos_BTH * qs, sin_BTH * qs), apply_rope(k, cos_BTH, sin_BTH)
        out: Array | None = None  # the decode's attention over a shared prompt, else computed below
        if kv is None:
            keys, values, new_kv = k, v, (k, v)
        else:
            # One small in-place update of the stacked cache per layer and decode step (the cache is the
            # layer loop's carry, so XLA updates its buffer in place), then this layer's slots are read.
            keys_LBSKH, values_LBSKH, layer, slot, window, prompt, samples = kv
            at = (jnp.asarray(layer, jnp.int32), jnp.int32(0), jnp.asarray(slot, jnp.int32), jnp.int32(0),
                  jnp.int32(0))  # fmt: skip
            keys_LBSKH = jax.lax.dynamic_update_slice(keys_LBSKH, k[None].astype(keys_LBSKH.dtype), at)
            values_LBSKH = jax.lax.dynamic_update_slice(values_LBSKH, v[None].astype(values_LBSKH.dtype), at)
            # This layer's first `window` slots (0: all), read by one dynamic slice of the stack: only the slots
            # this position can see (the rest are not written yet) leave HBM. (Slicing the window out of the
            # whole layer row instead made XLA copy the row first: the same bytes as no window.)
            size = (1, *keys_LBSKH.shape[1:2], window or keys_LBSKH.shape[2], *keys_LBSKH.shape[3:])
            row = (at[0], *at[1:2], jnp.int32(0), *at[3:])  # (layer, 0, 0, 0, 0)
            slots_BTS, mask_BTS = mask_BTS, mask_BTS[..., : size[2]]
            new_kv = (constrain_cache(keys_LBSKH), constrain_cache(values_LBSKH))
            if c.decode_attention == "pallas":  # one kernel reading this layer's slots in place
                out = decode_attention(q, keys_LBSKH, values_LBSKH, at[0], slots_BTS, prompt=prompt,
                                       window=size[2], samples=samples)  # fmt: skip
            elif samples > 1 and 0 < prompt < size[2]:  # each group's prompt slots read once
                parts = (*group_prompt(keys_LBSKH, values_LBSKH, at[0], prompt, samples),
                         *completion_slots(keys_LBSKH, values_LBSKH, at[0], prompt, size[2]))  # fmt: skip
                kp, vp, kc, vc = (x.astype(q.dtype) for x in parts)
                out = attend_shared_prompt(q, kp, vp, kc, vc, mask_BTS)
            else:
                keys = jax.lax.dynamic_slice(keys_LBSKH, row, size)[0]
                values = jax.lax.dynamic_slice(values_LBSKH, row, size)[0]
        if isinstance(mask_BTS, tuple):  # rows of [prompt, its completions]: qwen2.forward_hidden_grouped
            prompt_mask, prompt_self, completions = mask_BTS
            out = attend_grouped(q, keys, values, prompt_mask, prompt_self, completions, scaled, c.attention)
        elif scaled:  # the [B, T] attention mask: the Pallas kernel
            out = attend_flash(q, keys, values, mask_BTS, scaled=True)
        elif kv is None and c.attention == "cudnn":
            out = attend_fused(q, keys, values, mask_BTS)
        elif out is None:
            out = attend(q, keys.astype(q.dtype), values.astype(q.dtype), mask_BTS)
        out = constrain(constrain_sequences(out) if by_sequence else out, *BTNH)
        rows = residual_rows()
        return constrain(self._dense(c.hidden_size, False, "o_proj")(out.reshape(B, T, N * H)), *rows), new_kv


def attend_grouped(
    q_UTNH: Array, k_UTKH: Array, v_UTKH: Array, prompt_mask_UP: Array, prompt_self: Array, completions: Array,
    scaled: bool = False, impl: str = "xla",
) -> Array:  # fmt: skip
    """Attention over rows that each hold one group: its prompt's P tokens, then its G completions' C tokens each
    (T = P + G x C). The prompt attends over itself under `prompt_self` (its [U, P] attention mask: the Pallas
    kernel; or the [U, P, P] causal mask); each completion over its group's real prompt keys, then its own, under
    `completions` ([B, C] attention masks: the Pallas kernel, `scaled` as `attend_flash`'s; or [B, C, P + C],
    B = U x G; `impl` cudnn: both through trainer/model/fused.py) -> [U, T, N, H]."""
    (U, P), (B, C) = prompt_mask_UP.shape, completions.shape[:2]
    N, H = q_UTNH.shape[2:]
    q_UPNH, k_UPKH, v_UPKH = (x[:, :P] for x in (q_UTNH, k_UTKH, v_UTKH))
    q_BCNH, k_BCKH, v_BCKH = (x[:, P:].reshape(B, C, *x.shape[2:]) for x in (q_UTNH, k_UTKH, v_UTKH))
    if completions.ndim == 2:
        out_UPNH = attend_flash(q_UPNH, k_UPKH, v_UPKH, prompt_self, scaled)
        out_BCNH = attend_flash_after_prompt(
            q_BCNH, k_UPKH, v_UPKH, k_BCKH, v_BCKH, prompt_mask_UP, completions, scaled
        )
    elif impl == "cudnn":
        out_UPNH = attend_fused(q_UPNH, k_UPKH, v_UPKH, prompt_self)
        out_BCNH = attend_fused_shared_prompt(q_BCNH, k_UPKH, v_UPKH, k_BCKH, v_BCKH, completions)
    else:
        out_UPNH = attend(q_UPNH, k_UPKH, v_UPKH, prompt_self)
        out_BCNH = attend_shared_prompt(q_BCNH, k_UPKH, v_UPKH, k_BCKH, v_BCKH, completions)
    return jnp.concatenate([out_UPNH, out_BCNH.reshape(U, B // U * C, N, H)], axis=1)


MLP_UP = "mlp_up"  # the name the up projection's output carries for a remat policy (qwen2.REMAT_POLICIES)


class MLP(nn.Module):
    config: Qwen2Config
    fused: bool = False  # gate|up as one weight and one matmul (the decode layout); else HF's two

    @nn.compact
    def __call__(self, x_BTD: Array, rows: tuple[str, ...] = BTD) -> Array:
        c = self.config
        kw: dict[str, Any] = {
            "use_bias": False,
            "dtype": dt(c.dtype),
            "param_dtype": dt(c.param_dtype),
            "kernel_init": nn.initializers.normal(c.initializer_range),
        }
        x_BTD = constrain(x_BTD, "group_rows", "length", "embed")  # trainer.sharding.LOGICAL
        if self.fused:  # one matmul: [B, T, 2, F], the gate's columns then the up projection's
            gate_up = constrain(nn.DenseGeneral((2, c.intermediate_size), name="gate_up_proj", **kw)(x_BTD),
                                "batch", "length", None, "mlp")  # fmt: skip
            gate, up = (constrain(gate_up[:, :, i], *BTF) for i in (0, 1))
        else:  # Hugging Face's two projections (the training layout)
            gate = constrain(nn.Dense(c.intermediate_size, name="gate_proj", **kw)(x_BTD), *BTF)
            up = constrain(nn.Dense(c.intermediate_size, name="up_proj", **kw)(x_BTD), *BTF)
        up = jax.ad_checkpoint.checkpoint_name(up, MLP_UP)
        return constrain(nn.Dense(c.hidden_size, name="down_proj", **kw)(nn.silu(gate) * up), *rows)
