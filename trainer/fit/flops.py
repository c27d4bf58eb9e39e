"""Matmul FLOPs of a compiled program, read from its HLO text: every dot and convolution (fusion bodies
included), 2 x output elements x contracted size, times the runs of the computation that holds it.

Unlike XLA's cost analysis (which counts a loop body once and also counts elementwise ops), this counts a
scan over L layers L times (trainer.fit.hlo.Module.counts). TPU HLO writes most matmuls as convolutions
(`dim_labels=bf_io->bf`): their contracted size is the kernel's input features x its window (padding is not
subtracted: an upper bound for padded windows, exact for matmuls). Custom calls (Pallas kernels) are not
seen, as XLA does not see them either.
"""

from __future__ import annotations

import math
import re

from trainer.fit import hlo

_DIMS = re.compile(r"\[(?P<dims>[0-9,]*)\]")
_CONTRACTING = re.compile(r"\blhs_contracting_dims=\{(?P<dims>[0-9,]*)\}")
_LABELS = re.compile(r"\bdim_labels=(?P<lhs>\w+)_(?P<rhs>\w+)->(?P<out>\w+)")


def _shape(type_text: str) -> list[int]:
    m = _DIMS.search(type_text)
    return [int(d) for d in m["dims"].split(",") if d] if m else []


def matmul_flops(ins: hlo.Instruction, types: dict[str, str]) -> int:
    """2 x output elements x contracted size of one dot or convolution; `types` maps the operands' names
    (instructions of the same computation) to their types."""
    operands = [types.get(name, "") for name in hlo.operands(ins)]
    if len(operands) < 2:
        return 0
    out = math.prod(_shape(ins.type))
    if ins.op == "dot":
        lhs = _shape(operands[0])
        m = _CONTRACTING.search(ins.line)
        dims = [int(d) for d in m["dims"].split(",") if d] if m else []
        return 2 * out * math.prod(lhs[d] for d in dims if d < len(lhs))
    if ins.op == "convolution" and (m := _LABELS.search(ins.line)):
        kernel = _shape(operands[1])
        if len(kernel) != len(m["rhs"]):
            return 0
        # The kernel's input features times every spatial (window) dim: all but its output features.
        return 2 * out * math.prod(n for n, label in zip(kernel, m["rhs"], strict=True) if label != "o")
    return 0


def flops(hlo_text: str | hlo.Module) -> int:
    """Matmul FLOPs of one execution of the program (see the module docstring)."""
    module = hlo.module(hlo_text)
    total = 0
    for name, body in module.computations.items():
        types = {i.name: i.type for i in body}
        runs = module.counts[name]
        total += runs * sum(matmul_flops(i, types) for i in body if i.op in ("dot", "convolution"))
    return total
