"""Matmul FLOPs of a compiled program, read from its HLO text: every dot and convolution (fusion bodies
included), 2 x multiply-adds as XLA's HloCostAnalysis counts them, times the runs of the computation that
holds it (trainer.fit.hlo.Module.counts: a scan over L layers counts L times; XLA's cost analysis counts a
loop body once, and also counts elementwise ops, which this does not).

A dot: output elements x its contracted size. libtpu writes most matmuls as convolutions (`dim_labels=
bf_io->bf`), batched and multi-axis ones with spatial dims that are really batch dims or contracted dims
(windows with lhs_dilate, stride and padding): input features x output features x batch x, per spatial dim,
the (output, kernel) position pairs that land on an input element. Custom calls (Pallas kernels) carry no
matmul XLA can see; the one the trainer runs inside its update, splash attention
(jax.experimental.pallas.ops.tpu.splash_attention, libtpu names its custom calls `splash_mha_fwd...`,
`splash_mha_dq...`, `splash_mha_dkv...`), is counted from its operands' shapes: per (query, key) position pair of
the causal mask (the trainer's: the queries are the last Sq of the Skv keys, Sq = Skv but after a group's
prompt; the kernel computes whole blocks, so at least these), the matmuls each
kernel runs (forward QK^T and PV; dq QK^T, dO V^T and dS K; dkv QK^T, P^T dO, dO V^T and dS^T Q) over the head
dim. Other custom calls count nothing.
"""

from __future__ import annotations

import math
import re
from functools import cache

import numpy as np

from trainer.fit import hlo

_DIMS = re.compile(r"\[(?P<dims>[0-9,]*)\]")
_CONTRACTING = re.compile(r"\blhs_contracting_dims=\{(?P<dims>[0-9,]*)\}")
_LABELS = re.compile(r"\bdim_labels=(?P<lhs>\w+)_(?P<rhs>\w+)->(?P<out>\w+)")
_WINDOW = re.compile(r"\bwindow=\{(?P<window>[^}]*)\}")
_GROUPS = re.compile(r"\b(?P<kind>feature|batch)_group_count=(?P<n>\d+)")


def _shape(type_text: str) -> list[int]:
    m = _DIMS.search(type_text)
    return [int(d) for d in m["dims"].split(",") if d] if m else []


@cache
def _taps(
    inputs: int, outputs: int, kernel: int, stride: int, pad_low: int, lhs_dilate: int, rhs_dilate: int
) -> int:
    """(output position, kernel position) pairs of one spatial dim that land on an input element, not on
    padding or a hole of the input's dilation (XLA's HloCostAnalysis::GetConvolutionFlops)."""
    out = np.arange(outputs, dtype=np.int64)
    total = 0
    for k in range(kernel):
        at = out * stride - pad_low + k * rhs_dilate  # in the dilated, padded input
        total += int(np.count_nonzero((at % lhs_dilate == 0) & (at >= 0) & (at // lhs_dilate < inputs)))
    return total


def _convolution(line: str, lhs: list[int], rhs: list[int], out: list[int]) -> int:
    """Multiply-adds of a convolution as XLA counts them. libtpu writes batched and multi-contraction matmuls
    as convolutions whose spatial dims are batch dims (window = lhs_dilate = the dim, stride one less: one
    tap per output) or contracted dims (padded windows: a tap per input element), so the taps are counted,
    not the window size."""
    labels = _LABELS.search(line)
    if labels is None or (len(lhs), len(rhs), len(out)) != tuple(
        len(labels[k]) for k in ("lhs", "rhs", "out")
    ):
        return 0
    window = _WINDOW.search(line)
    pairs = (f.split("=", 1) for f in window["window"].split()) if window else ()
    fields = {k: v for k, v in pairs}

    def per_dim(key: str, default: int, n: int) -> list[int]:
        return [int(v) for v in fields[key].split("x")] if key in fields else [default] * n

    spatial = sorted(c for c in labels["lhs"] if c.isdigit())
    n = len(spatial)
    pads = [int(p.split("_")[0]) for p in fields["pad"].split("x")] if "pad" in fields else [0] * n
    strides, lhs_dil, rhs_dil = (
        per_dim("stride", 1, n),
        per_dim("lhs_dilate", 1, n),
        per_dim("rhs_dilate", 1, n),
    )
    taps = math.prod(
        _taps(lhs[labels["lhs"].index(d)], out[labels["out"].index(d)], rhs[labels["rhs"].index(d)], strides[i],
              pads[i], lhs_dil[i], rhs_dil[i])
        for i, d in enumerate(spatial)
    )  # fmt: skip
    groups = {m["kind"]: int(m["n"]) for m in _GROUPS.finditer(line)}
    features_in = lhs[labels["lhs"].index("f")] // groups.get("feature", 1)
    batch = lhs[labels["lhs"].index("b")] // groups.get("batch", 1)
    return features_in * out[labels["out"].index("f")] * batch * taps


_SPLASH = re.compile(r"^splash_mha_(?P<kind>fwd|dq|dkv)")
_SPLASH_MATMULS = {"fwd": 2, "dq": 3, "dkv": 4}
COUNTED = ("dot", "convolution", "custom-call")  # the ops matmul_flops can count


def _splash(ins: hlo.Instruction, operands: list[list[int]]) -> int:
    """2 x multiply-adds of a splash attention kernel (see the module docstring): queries [B, H, Sq, D] are its
    4-d operand with the most heads, keys the one with the fewest."""
    m = _SPLASH.match(ins.name)
    heads = [s for s in operands if len(s) == 4]
    if m is None or len(heads) < 2:
        return 0
    (b, h, sq, d), skv = max(heads, key=lambda s: s[1]), min(heads, key=lambda s: s[1])[2]
    pairs = sq * (skv - sq) + sq * (sq + 1) // 2 if sq <= skv else sq * skv  # the last sq of the skv keys
    return _SPLASH_MATMULS[m["kind"]] * 2 * b * h * pairs * d


def matmul_flops(ins: hlo.Instruction, types: dict[str, str]) -> int:
    """2 x multiply-adds of one dot, convolution or splash attention kernel, as XLA counts a dot; `types` maps
    the operands' names (instructions of the same computation) to their types."""
    operands = [_shape(types.get(name, "")) for name in hlo.operands(ins)]
    if ins.op == "custom-call":
        return _splash(ins, operands)
    if len(operands) < 2:
        return 0
    if ins.op == "dot":  # output elements x contracted size
        m = _CONTRACTING.search(ins.line)
        dims = [int(d) for d in m["dims"].split(",") if d] if m else []
        return (
            2 * math.prod(_shape(ins.type)) * math.prod(operands[0][d] for d in dims if d < len(operands[0]))
        )
    if ins.op == "convolution":
        return 2 * _convolution(ins.line, operands[0], operands[1], _shape(ins.type))
    return 0


def flops(hlo_text: str | hlo.Module) -> int:
    """Matmul FLOPs of one execution of the program (see the module docstring)."""
    module = hlo.module(hlo_text)
    total = 0
    for name, body in module.computations.items():
        types = {i.name: i.type for i in body}
        runs = module.counts[name]
        total += runs * sum(matmul_flops(i, types) for i in body if i.op in COUNTED)
    return total


def op_flops(hlo_text: str | hlo.Module) -> dict[str, int]:
    """Matmul FLOPs of one run of each top-level op (an op of the entry, a loop body or a called computation),
    by instruction name: a fusion counts the dots and convolutions of its body, nested fusions included."""
    module = hlo.module(hlo_text)

    @cache
    def inside(name: str) -> int:
        body = module.computations.get(name, [])
        types = {i.name: i.type for i in body}
        own = sum(matmul_flops(i, types) for i in body if i.op in COUNTED)
        return own + sum(
            inside(callee) for i in body for _, callee in hlo.callees(i.line) if callee in module.nested
        )

    out = {}
    for name, body in module.computations.items():
        if name in module.nested:
            continue
        types = {i.name: i.type for i in body}
        for i in body:
            n = matmul_flops(i, types) if i.op in COUNTED else 0
            n += sum(inside(callee) for _, callee in hlo.callees(i.line) if callee in module.nested)
            if n:
                out[i.name] = n
    return out
