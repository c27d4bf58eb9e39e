"""Self-attention without [T, T] scores in HBM (update and prefill): jax's Pallas TPU splash-attention kernel.

Dims: B batch, T tokens (queries and keys alike: self-attention), N query heads, K key/value heads, H head dim.
The reference is `qwen2.attend` over `qwen2.causal_mask(attention_mask_BT)`; `attend_flash` gives real tokens
the same output and gradients (tests/trainer/model/test_flash.py). Left (and right) padding become segment ids
(real tokens one segment, padding the other) under a causal mask: a real query sees exactly the real keys at
or before it, as in the reference. A padding query sees the padding keys at or before it (at least itself), so
its row is finite; the reference gives a left-padding row the uniform mean of every value and a right-padding
row (after a completion's end) the real keys before it. Padding rows never reach a real token (no real query
sees a padding key) and their positions carry no loss, so nothing real differs.

Numerics: q @ k and the softmax in float32 as in the reference; q is scaled by 1/sqrt(H) in its own dtype
before the kernel (the kernel has no scale), or comes scaled (`scaled=True`: the layers fold the scale into
RoPE's float32 tables, one pass fewer over q: the seed's update 0.774 -> 0.771 s, docs/performance.md); the
kernel multiplies float32 probabilities by v cast to float32 and normalises at the end (the reference rounds
the probabilities to v's dtype first).

Under a mesh in context the kernel runs per device (`jax.shard_map`): rows split over the batch axes, heads
over tp when tp divides the kv heads (query head n belongs to kv head n // (N / K), so contiguous head blocks
keep their groups). Off TPU (and for no TPU compile target) it runs in Pallas interpret mode: the CPU tests.
`attend_flash_after_prompt` is the same kernel for completions after their group's shared prompt (the update's
grouped forward): their queries are the last C of P + C keys, so the causal mask's diagonal is shifted by P.
`train.attention_impl` (auto | xla | pallas) picks it for the update and the rollout's prefill (the decode
attends over its cache with `attend`); `resolve` turns auto into a choice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel import SplashAttentionKernel
from jax.sharding import PartitionSpec as P

from trainer.kernels.logprob.blocks import device_kind
from trainer.kernels.sharded import active_mesh
from trainer.sharding import logical_spec

IMPLS = ("xla", "pallas", "cudnn")  # cudnn: trainer/model/fused.py, for GPUs
CUDNN_ON_TPU = (
    "train.attention_impl=cudnn is cuDNN's fused attention for GPUs; on a TPU set train.attention_impl=auto (the "
    "Pallas splash kernel)"
)
LANES = 128  # the kernel's key blocks are multiples of the TPU lane width, and so must T be


@dataclass(frozen=True)
class Blocks:
    """Query and key block sizes of the forward and both backward kernels; multiples of 128."""

    q: int = 512
    kv: int = 512

    def __post_init__(self) -> None:
        for name in ("q", "kv"):
            size = getattr(self, name)
            if size <= 0 or size % LANES:
                raise ValueError(f"Blocks.{name} must be a positive multiple of {LANES}, received {size}")

    def fitted(self, T: int, T_kv: int = 0) -> Blocks:
        """The largest blocks up to these that divide T queries and T_kv keys (default T; multiples of 128)."""
        return Blocks(
            *(max(b for b in range(LANES, size + 1, LANES) if n % b == 0)
              for size, n in ((self.q, T), (self.kv, T_kv or T)))
        )  # fmt: skip

    def splash(self) -> splash.BlockSizes:
        q, kv = self.q, self.kv
        return splash.BlockSizes(
            block_q=q, block_kv=kv, block_kv_compute=kv, block_q_dkv=q, block_kv_dkv=kv,
            block_kv_dkv_compute=kv, block_q_dq=q, block_kv_dq=kv,
        )  # fmt: skip


# Not tuned on hardware (no TPU here): 512 is MaxText's splash default for v5e/v6e; a [512, 128] bf16 block of
# q, k or v is 128 KiB and the float32 [512, 512] scores block 1 MiB, well inside scoped VMEM.
TUNED: dict[str, Blocks] = {"tpu": Blocks(512, 512), "cpu": Blocks(128, 128)}


def _on_tpu() -> bool:
    return device_kind().lower().startswith("tpu")


def supported(T: int) -> str | None:
    """Why the kernel cannot run over T tokens, or None when it can."""
    if T % LANES:
        return f"the sequence length must be a multiple of {LANES} for the Pallas attention, received {T}"
    return None


def resolve(name: str, T: int, on_tpu: bool | None = None, strict: bool = True) -> str:
    """The attention `name` (auto | xla | pallas | cudnn) stands for over T tokens: auto is pallas on a TPU (or a
    TPU compile target) where T allows it, else xla; pallas where T does not allow it is an error (`strict`, the
    update: the config check refuses it first) or xla (the prefill, whose prompt buckets the check leaves free);
    cudnn on a TPU is an error (it is a GPU kernel: splash is the TPU's)."""
    if name not in (*IMPLS, "auto"):
        raise ValueError(f"attention impl must be one of {(*IMPLS, 'auto')}, received {name!r}")
    tpu = _on_tpu() if on_tpu is None else on_tpu
    if name == "cudnn" and tpu:
        raise ValueError(CUDNN_ON_TPU)
    if name == "auto":
        return "pallas" if tpu and supported(T) is None else "xla"
    if name == "pallas" and (why := supported(T)):
        if strict:
            raise ValueError(why)
        return "xla"
    return name


def _kernel(N: int, T: int, T_kv: int, blocks: Blocks, interpret: bool) -> SplashAttentionKernel:
    """The causal kernel for N heads, T queries over T_kv keys (the queries are the last T of them). Its block
    masks are computed in NumPy at trace time and become constants of the program (not cached across traces:
    the kernel holds them as arrays)."""
    mask = splash.MultiHeadMask([splash.CausalMask((T, T_kv), offset=T_kv - T) for _ in range(N)])
    return splash.make_splash_mha(
        mask, block_sizes=blocks.splash(), head_shards=1, q_seq_shards=1, interpret=interpret
    )


def _local(
    q_BTNH: Array, k_BSKH: Array, v_BSKH: Array, segment_BT: Array, segment_BS: Array, blocks: Blocks,
    interpret: bool, scaled: bool,
) -> Array:  # fmt: skip
    """The kernel on one device's rows and heads (T queries, the last T of the S keys)."""
    _, T, N, H = q_BTNH.shape
    S = k_BSKH.shape[1]
    kernel = _kernel(N, T, S, blocks.fitted(T, S), interpret)
    if not scaled:
        q_BTNH = q_BTNH * jnp.asarray(1.0 / np.sqrt(H), q_BTNH.dtype)
    q_BNTH = q_BTNH.transpose(0, 2, 1, 3)
    k_BKTH, v_BKTH = k_BSKH.transpose(0, 2, 1, 3), v_BSKH.transpose(0, 2, 1, 3)
    segments = splash.SegmentIds(q=segment_BT, kv=segment_BS)
    out_BNTH = jax.vmap(kernel)(q_BNTH, k_BKTH, v_BKTH, segment_ids=segments)  # (no residuals asked for)
    return cast(Array, out_BNTH).transpose(0, 2, 1, 3)


def attend_flash(
    q_BTNH: Array, k_BTKH: Array, v_BTKH: Array, attention_mask_BT: Array, scaled: bool = False
) -> Array:
    """Causal grouped-query self-attention over the real tokens of `attention_mask_BT` -> [B, T, N, H]. `scaled`:
    the queries come already multiplied by 1 / sqrt(H)."""
    B, T, N, H = q_BTNH.shape
    K = k_BTKH.shape[2]
    if k_BTKH.shape != (B, T, K, H) or v_BTKH.shape != k_BTKH.shape or N % K:
        raise ValueError(
            f"expected q [B, T, N, H] and k, v [B, T, K, H] with K dividing N, received {q_BTNH.shape}, "
            f"{k_BTKH.shape} and {v_BTKH.shape}"
        )
    if attention_mask_BT.shape != (B, T):
        raise ValueError(f"expected the attention mask [B, T] = {(B, T)}, received {attention_mask_BT.shape}")
    if why := supported(T):
        raise ValueError(why)
    segment_BT = attention_mask_BT.astype(jnp.int32)
    return _sharded(q_BTNH, k_BTKH, v_BTKH, segment_BT, segment_BT, scaled)


def attend_flash_after_prompt(
    q_BCNH: Array, kp_UPKH: Array, vp_UPKH: Array, kc_BCKH: Array, vc_BCKH: Array, prompt_mask_UP: Array,
    mask_BC: Array, scaled: bool = False,
) -> Array:  # fmt: skip
    """Completions in groups of B / U rows per prompt (`attention.attend_shared_prompt`'s rows): each row's C
    queries over its group's P prompt keys (the real ones), then its own real keys at or before it, by the same
    kernel over [P + C] keys (the prompt's repeated over its group) with the causal mask's diagonal shifted by P
    -> [B, C, N, H]. What `attend_flash` gives the completion's positions of the whole rows [prompt, completion]."""
    B, C, _, H = q_BCNH.shape
    U, P, K, _ = kp_UPKH.shape
    if B % U or kc_BCKH.shape != (B, C, K, H) or prompt_mask_UP.shape != (U, P) or mask_BC.shape != (B, C):
        raise ValueError(
            f"expected q [B, C, N, H], the prompts' k, v [U, P, K, H] and masks [U, P], the completions' k, v "
            f"[B, C, K, H] and masks [B, C] with U dividing B, received {q_BCNH.shape}, {kp_UPKH.shape}, "
            f"{prompt_mask_UP.shape}, {kc_BCKH.shape} and {mask_BC.shape}"
        )
    if why := supported(P) or supported(C):
        raise ValueError(why)

    def per_row(x: Array) -> Array:
        return jnp.repeat(x, B // U, axis=0)

    k_BSKH, v_BSKH = (
        jnp.concatenate([per_row(p), c], axis=1) for p, c in ((kp_UPKH, kc_BCKH), (vp_UPKH, vc_BCKH))
    )
    segment_BC = mask_BC.astype(jnp.int32)
    segment_BS = jnp.concatenate([per_row(prompt_mask_UP.astype(jnp.int32)), segment_BC], axis=1)
    return _sharded(q_BCNH, k_BSKH, v_BSKH, segment_BC, segment_BS, scaled)


def _sharded(
    q_BTNH: Array, k_BSKH: Array, v_BSKH: Array, segment_BT: Array, segment_BS: Array, scaled: bool
) -> Array:
    """`_local` on this platform's blocks, per device under a mesh in context."""
    on_tpu = _on_tpu()
    blocks = TUNED["tpu" if on_tpu else "cpu"]
    local = functools.partial(_local, blocks=blocks, interpret=not on_tpu, scaled=scaled)
    mesh = active_mesh()
    if mesh is None:
        return local(q_BTNH, k_BSKH, v_BSKH, segment_BT, segment_BS)
    # Rows over the batch axes that divide B; heads over tp only where tp divides K (and so N): a query head's
    # kv head must be on its device.
    kv_spec = logical_spec(("batch", None, "kv_heads", None), k_BSKH.shape, mesh)
    kv_spec = P(kv_spec[0], None, kv_spec[2], None)
    q_spec = P(kv_spec[0], None, kv_spec[2], None)
    row_spec = P(kv_spec[0], None)
    return jax.shard_map(
        local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, row_spec, row_spec), out_specs=q_spec,
        check_vma=False,
    )(q_BTNH, k_BSKH, v_BSKH, segment_BT, segment_BS)  # fmt: skip
