"""Analytic roofline of one GRPO step (prefill, decode, update) on one GPU, and the table device_step prints.

Counts are the work a step NEEDS, not what the code happens to do: causal attention over the tokens written so
far (prompt's real tokens + completion so far), each prompt run and its keys/values read once per group of
`samples` rows that share it (as the sampler does since the eleventh pass), every bf16 weight read once per
decode token, the update's matmuls forward + backward (3x the forward: the MFU convention, so `remat: full`'s
recomputation and the dense-masked attention are the code's overhead, not the bound's). Each phase's bound is max(FLOPs / peak
FLOP/s, bytes / HBM bandwidth) at 100% of the GPU's published peaks (dense bf16, no sparsity).
Dims: N sequences, P prompt bucket, C max new tokens, L layers, D hidden, F MLP, Q query heads, K kv heads,
H head dim, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_bw: float  # bytes/s
    bf16_flops: float  # dense FLOP/s


# NVIDIA's datasheets (SXM parts): H100 3.35 TB/s, 989 TFLOP/s bf16 dense; H200 4.8 TB/s, same tensor cores.
GPUS = {"h100": Gpu("H100 SXM", 3.35e12, 989e12), "h200": Gpu("H200 SXM", 4.8e12, 989e12)}


def gpu_for(device_kind: str) -> tuple[Gpu, str]:
    """The peak figures for a jax device_kind; anything else (CPU, other GPUs) gets the H100's, said so."""
    kind = device_kind.lower()
    for key, gpu in GPUS.items():
        if key in kind:
            return gpu, ""
    return GPUS["h100"], f"{device_kind} is not in the table: estimates use the H100's peaks"


def layer_weights(m: Any) -> int:
    """Matmul weights of one decoder layer (q, k, v, o, gate, up, down)."""
    D, H = m.hidden_size, m.head_dim
    Q, K = m.num_attention_heads, m.num_key_value_heads
    return D * Q * H + 2 * D * K * H + Q * H * D + 3 * D * m.intermediate_size


def phase_counts(
    m: Any, n_params: int, prompt_lens: list[int], P: int, C: int, decode_iters: int, n_micro: int,
    samples: int = 1,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """{phase: {flops, bytes}} of the needed work. decode_iters: decode loop iterations run (all N rows each);
    prompt_lens: one per row, the rows in groups of `samples` sharing a prompt."""
    N, L, D, V = len(prompt_lens), m.num_hidden_layers, m.hidden_size, m.vocab_size
    QH, KH = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    body = L * layer_weights(m)
    kv_per_token = L * 2 * KH * 2  # bf16 keys + values, every layer
    unique = prompt_lens[::samples]
    real = sum(unique)
    # Prefill: every real token of each distinct prompt through the layers, causal attention, the LM head for
    # the last one.
    prefill_flops = (
        2 * body * real + sum(4 * L * QH * n * (n + 1) / 2 for n in unique) + 2 * D * V * len(unique)
    )
    prefill_bytes = 2 * (body + D * V) + kv_per_token * real
    # Decode iteration t (1..iters): one token per row, attention over its len + t written positions (FLOPs per
    # row; the prompt's keys/values read once per group), the LM head, float32 logits written and read once by
    # the sampler.
    ctx = sum(n * decode_iters + decode_iters * (decode_iters + 1) / 2 for n in prompt_lens)
    read = real * decode_iters + N * decode_iters * (decode_iters + 1) / 2
    decode_flops = decode_iters * N * 2 * (body + D * V) + 4 * L * QH * ctx
    decode_bytes = decode_iters * (2 * (body + D * V) + 2 * N * V * 4) + kv_per_token * read
    # Update: N sequences of S = P + C through the layers forward and backward (3x), causal attention, the LM
    # head on the C completion positions; float32 master weights read forward and backward and the gradient
    # accumulated per micro-batch, then AdamW (read p, g, m, v; write p, m, v).
    S = P + C
    fwd = 2 * body * N * S + 4 * L * QH * N * S * (S + 1) / 2 + 2 * D * V * N * C
    update_bytes = n_micro * 16 * n_params + 28 * n_params
    out = {
        "prefill": {"flops": prefill_flops, "bytes": prefill_bytes},
        "decode": {"flops": decode_flops, "bytes": decode_bytes},
        "update": {"flops": 3 * fwd, "bytes": update_bytes},
    }
    return out


def bound_s(counts: dict[str, float], gpu: Gpu) -> float:
    return max(counts["flops"] / gpu.bf16_flops, counts["bytes"] / gpu.hbm_bw)


def render(results: list[dict[str, Any]]) -> str:
    """The text table: one row per size, measured beside the roofline."""
    head = (
        f"{'size':<6}{'status':<10}{'step s':>8}{'bound s':>9}{'x bound':>8}{'prefill s':>10}{'decode s':>9}"
        f"{'tok/s':>9}{'MBU':>6}{'update s':>9}{'MFU upd':>8}{'MFU step':>9}{'compile s':>10}  batch"
    )
    lines = [head]
    for r in results:
        m = r.get("measured") or {}
        e = r.get("estimate") or {}

        def f(x: Any, fmt: str) -> str:
            return (
                format(x, fmt)
                if isinstance(x, int | float)
                else "-".rjust(int(fmt.split(".", maxsplit=1)[0]))
            )

        batch = r.get("workload", {})
        lines.append(
            f"{r['size']:<6}{r.get('status', '?'):<10}{f(m.get('step_s'), '8.2f')}{f(e.get('step_s'), '9.2f')}"
            f"{f(m.get('step_s') and e.get('step_s') and m['step_s'] / e['step_s'], '8.1f')}"
            f"{f(m.get('prefill_s'), '10.3f')}{f(m.get('decode_s'), '9.2f')}{f(m.get('decode_tokens_per_s'), '9.0f')}"
            f"{f(m.get('decode_mbu'), '6.0%')}{f(m.get('update_s'), '9.2f')}{f(m.get('update_mfu'), '8.0%')}"
            f"{f(m.get('step_mfu'), '9.0%')}{f(m.get('compile_s'), '10.0f')}  "
            + (
                f"{batch.get('prompts')}x{batch.get('samples')} P={batch.get('prompt_len')} "
                f"C={batch.get('new_tokens')} micro={batch.get('micro_batch')}"
                if batch
                else ""
            )
        )
        if r.get("error"):
            lines.append(f"      error: {r['error']}")
    return "\n".join(lines)
