"""Where a compiled TPU program's HBM bytes go: the bytes each top-level HLO op reads and writes in HBM.

Why not XLA's `bytes accessed` alone: on TPU it also counts VMEM. A weight prefetched into VMEM (`copy-start`
to memory space S(1)) is counted when read from HBM, when written to VMEM, and again by the matmul that reads
it there, plus a no-op bitcast fusion nested in the matmul that counts as one more read and write: a decode
matmul of a 22.5 MB weight costs 113 MB by that count (docs/performance.md). This module reads the compiled
text instead: every instruction of the entry, of loop bodies and of called computations (not the insides of
fusions), with the bytes of its operands and results that live in HBM (memory space 0). In-place updates
(dynamic-update-slice) count their update, slices and gathers what they read (also inside a fusion, at any
depth: a scan's matmul fusion takes the whole stack of layer weights and slices one layer one fusion down),
the `-done` halves of async pairs and views (tuples, bitcasts, parameters) nothing. An op in a loop body
counts as many times as the body runs (trainer.fit.hlo: a scan over L layers, L times; XLA's `bytes accessed`
counts a loop body once). Rows are grouped by the JAX source that made them (`op_name` metadata; the layer
scan's body is one source per op for all layers).
It is an accounting of the program, not a profile: a kernel that re-reads an operand from HBM counts once.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from trainer.fit import hlo
from trainer.fit.hlo import _BYTES, _OPERAND, Instruction

_ARRAY = re.compile(r"(?P<dtype>[a-z]+[0-9a-z]*)\[(?P<dims>[0-9,]*)\](?:\{(?P<layout>[^}]*)\})?")
_SPACE = re.compile(r"S\((?P<space>\d+)\)")
_SOURCE = re.compile(r'op_name="(?P<src>[^"]*)"')
# Ops that move no bytes themselves: views, bookkeeping, the finishing half of async pairs, and control flow
# (their bodies are accounted op by op).
_FREE = frozenset({
    "get-tuple-element", "tuple", "bitcast", "parameter", "constant", "partition-id", "replica-id", "after-all",
    "opt-barrier", "copy-done", "slice-done", "all-gather-done", "all-reduce-done", "collective-permute-done",
    "async-done", "call-done", "while", "call", "conditional",
})  # fmt: skip
# Ops that read only their result's worth of their first operand.
_PARTIAL_READS = frozenset({"gather", "dynamic-slice", "slice"})


def _arrays(text: str) -> list[tuple[int, int]]:
    """(bytes, memory space) of every array in an HLO type (0: HBM, 1: VMEM, ...)."""
    out = []
    for m in _ARRAY.finditer(text):
        if m["dtype"] in _BYTES:
            n = 1
            for d in m["dims"].split(","):
                n *= int(d) if d else 1
            space = _SPACE.search(m["layout"] or "")
            out.append((n * _BYTES[m["dtype"]], int(space["space"]) if space else 0))
    return out


def _hbm(text: str) -> int:
    return sum(b for b, space in _arrays(text) if space == 0)


@dataclass(frozen=True)
class OpBytes:
    name: str
    op: str
    source: str  # JAX op_name without the program's own jit ("" when the op carries none)
    operand_bytes: int  # per run
    result_bytes: int  # per run
    count: int = 1  # runs per execution of the program (trainer.fit.hlo.Module.counts: loops multiply)

    @property
    def bytes(self) -> int:
        """Over one execution of the program: per run x runs."""
        return (self.operand_bytes + self.result_bytes) * self.count


def _source(line: str) -> str:
    m = _SOURCE.search(line)
    if not m:
        return ""
    src = re.sub(r"^jit\([^)]*\)/(while/(body|cond)/)?", "", m["src"])  # the program's own jit and its loop
    return re.sub(r"jit\(([^)]*)\)", r"\1", src)


def _in_place_relayouts(
    computations: dict[str, list[Instruction]], body: list[Instruction]
) -> dict[str, str]:
    """Result -> operand of each fusion in `body` that only copies its one operand and that XLA marks in place
    (`output_to_operand_aliasing`). libtpu leaves these inside TPU7x programs: a change of tiling (bf16
    T(16,128) -> T(8,128)) of a whole stacked weight or KV cache, nested in the fusion that slices one layer out
    of it. A copy that writes into its own operand's buffer is applied as the consumer reads (the consumer here
    reads one layer's window), so it is counted as a view: its uses are its operand's (docs/fit.md)."""
    out: dict[str, str] = {}
    for n, _, op, args, line in body:
        callee = dict(hlo.callees(line)).get("calls") if op == "fusion" else None
        inner = [o for _, _, o, _, _ in computations.get(callee or "", [])]
        if sorted(inner) == ["copy", "parameter"] and "output_to_operand_aliasing={{}: (0, {})}" in line:
            source = next(_OPERAND.finditer(args))["name"]
            out[n] = out.get(source, source)
    return out


def _operand_reads(computations: dict[str, list[Instruction]], name: str) -> dict[int, int]:
    """For a fused computation: parameter index -> bytes it reads when it is only sliced or gathered from
    (every use a gather/slice, the in-place target of the root dynamic-update-slice, or such a parameter of a
    nested fusion: a scan's stacked weights are sliced one layer at a time one fusion down; through an in-place
    relayout, `_in_place_relayouts`)."""
    body = computations[name]
    params = {n: int(args) for n, _, op, args, _ in body if op == "parameter" and args.isdigit()}
    views = _in_place_relayouts(computations, body)
    outputs = _outputs(body)
    uses: dict[str, list[tuple[int, str]]] = defaultdict(list)  # operand -> (bytes it reads, how)
    for n, typ, op, args, line in body:
        if n in views:
            continue
        root = n in outputs
        callee = dict(hlo.callees(line)).get("calls") if op == "fusion" else None
        nested = _operand_reads(computations, callee) if callee in computations else {}
        for i, m in enumerate(_OPERAND.finditer(args)):
            src = views.get(m["name"], m["name"])
            if i == 0 and op == "dynamic-update-slice" and root:
                uses[src].append((0, "in place"))
            elif i == 0 and op in _PARTIAL_READS:  # the sliced operand, not the indices
                uses[src].append((sum(b for b, _ in _arrays(typ)), "window"))
            elif i in nested and (nested[i] or root):  # in place only as the result of this fusion too
                uses[src].append((nested[i], "window" if nested[i] else "in place"))
            else:
                uses[src].append((0, "whole"))
    return {
        index: sum(b for b, _ in uses[name])
        for name, index in params.items()
        if uses[name] and all(how != "whole" for _, how in uses[name])
    }


def _outputs(body: list[Instruction]) -> set[str]:
    """The instructions a fused computation returns: its ROOT, or each element of a ROOT tuple (a multi-output
    fusion, e.g. one that updates a scan's stacked keys and values in place together)."""
    for n, _, op, args, line in body:
        if line.lstrip().startswith("ROOT"):
            return {m["name"] for m in _OPERAND.finditer(args)} if op == "tuple" else {n}
    return set()


def op_bytes(hlo_text: str | hlo.Module) -> list[OpBytes]:
    """Every top-level op of a compiled module with the HBM bytes it reads and writes over one execution of
    the program (per run x the runs of its computation), largest first."""
    module = hlo.module(hlo_text)
    computations = module.computations
    rows = []
    for name, body in computations.items():
        if name in module.nested:  # a fusion's or a reduction's body: its caller's operands and result
            continue
        types = {n: t for n, t, *_ in body}
        for n, typ, op, args, line in body:
            if op in _FREE:
                continue
            arrays = _arrays(typ)
            if op == "copy-start":  # (destination, source, context)
                arrays = arrays[:1]
            elif (
                op.endswith("-start") and len(arrays) > 1
            ):  # (operands..., results..., [context]): the results
                arrays = arrays[len(arrays) // 2 :]
            result = sum(b for b, space in arrays if space == 0)
            operands = [types.get(a["name"], "(") for a in _OPERAND.finditer(args)]
            reads = [0 if t.startswith("(") else _hbm(t) for t in operands]
            callee = dict(hlo.callees(line)).get("calls")
            if op == "fusion" and callee in computations:
                for i, b in _operand_reads(computations, callee).items():
                    if i < len(reads) and reads[i]:
                        if b == 0:  # updated in place: that output is written only where the update lands
                            result = max(result - reads[i], 0)
                        reads[i] = b
            if op in ("dynamic-update-slice", "slice-start", "dynamic-slice", "slice", "gather"):
                # In place, or reading a window: the moved bytes are the update's / the result's.
                moved = reads[1] if op == "dynamic-update-slice" else sum(b for b, _ in arrays)
                reads, result = [moved], moved if op == "dynamic-update-slice" else result
            rows.append(OpBytes(n, op, _source(line), sum(reads), result, module.counts[name]))
    return sorted(rows, key=lambda r: r.bytes, reverse=True)


def by_source(rows: list[OpBytes], top: int = 12) -> list[dict[str, object]]:
    """The `top` sources by bytes: [{source, ops, bytes}], the rest summed in one last "other" row."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        key = r.source or f"({r.op})"
        totals[key][0] += r.bytes
        totals[key][1] += 1
    ranked = sorted(totals.items(), key=lambda kv: kv[1][0], reverse=True)
    out: list[dict[str, object]] = [{"source": k, "ops": n, "bytes": b} for k, (b, n) in ranked[:top]]
    if rest := ranked[top:]:
        out.append(
            {"source": "other", "ops": sum(n for _, (_, n) in rest), "bytes": sum(b for _, (b, _) in rest)}
        )
    return out
