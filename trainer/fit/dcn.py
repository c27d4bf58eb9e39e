"""What a compiled multislice program sends between slices (over DCN), per device and execution.

libtpu compiles each slice's program alone: a reduction across slices is not an HLO all-reduce with a
cross-slice replica group but a host-transfer `send` handled by `xla_megascale_runtime` (frontend attribute
`_xla_megascale_reduce_operation`), paired with a `recv` of the reduced result. Those sends are the DCN traffic;
collectives whose replica group spans slices (should a compiler emit them) count too, and a collective-permute
that sends from one slice to another (it has source-target pairs, not groups)."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from trainer.fit import hlo

MEGASCALE = 'xla_megascale_runtime"'
_PAIRS = re.compile(r"source_target_pairs=\{(?P<pairs>(?:\{\d+,\d+\},?)*)\}")


class DcnOp(NamedTuple):
    name: str
    kind: str  # "megascale-send" or an HLO collective kind
    bytes: int  # what one device sends per run
    runs: int  # runs per execution of the program


def slice_of_partition(mesh: Any) -> list[int]:
    """Each partition id's slice: partition p is the mesh's p-th device in row-major order (jit's assignment)."""
    return [int(getattr(d, "slice_index", 0)) for d in mesh.devices.reshape(-1)]


def dcn_ops(text: str | hlo.Module, mesh: Any = None) -> list[DcnOp]:
    """The program's DCN transfers: megascale sends, and (given the mesh) collectives whose group spans slices."""
    mod = hlo.module(text)
    out = []
    for name, body in mod.computations.items():
        for ins in body:
            if ins.op == "send" and MEGASCALE in ins.line:
                data = hlo._array_bytes(ins.type)[:1]  # (data, u32[] context, token[])
                out.append(DcnOp(ins.name, "megascale-send", sum(data), mod.counts[name]))
    slices = slice_of_partition(mesh) if mesh is not None else []
    lines = {ins.name: ins.line for body in mod.computations.values() for ins in body}
    for op in hlo.collective_ops(mod, len(slices)) if slices else []:
        if _crosses(op, lines[op.name], slices):
            out.append(DcnOp(op.name, op.kind, int(op.moved_bytes), op.runs))
    return out


def _crosses(op: hlo.CollectiveOp, line: str, slices: list[int]) -> bool:
    """A collective's first group spans slices; a permute sends to another slice in one of its pairs."""
    if op.kind == "collective-permute" and (m := _PAIRS.search(line)):
        pairs = [(int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)\}", m["pairs"])]
        return any(slices[a] != slices[b] for a, b in pairs if a < len(slices) and b < len(slices))
    return len({slices[p] for p in op.group if p < len(slices)}) > 1


def dcn_bytes(text: str | hlo.Module, mesh: Any = None) -> int:
    """Bytes each device sends over DCN in one execution of the program."""
    return sum(op.runs * op.bytes for op in dcn_ops(text, mesh))
