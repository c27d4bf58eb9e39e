"""Collectives of a compiled program, read from its HLO text: result bytes per kind and the bytes each device
moves over ICI (ring algorithms: all-gather R(n-1)/n, reduce-scatter R(n-1), all-reduce 2R(n-1)/n).

A collective inside a loop body or a called computation is counted once, as XLA's cost analysis counts
loop bodies once (trainer.fit compiles one loop iteration on its own and multiplies).
"""

from __future__ import annotations

import re

import numpy as np

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8, "c64": 8, "f8e4m3fn": 1, "f8e5m2": 1}  # fmt: skip
_OP = re.compile(r"=\s*(?P<type>\(.*?\)|\S+)\s+(?P<op>" + "|".join(KINDS) + r")(?P<start>-start)?\(")
_ARRAY = re.compile(r"(?P<dtype>[a-z]+[0-9a-z]*)\[(?P<dims>[0-9,]*)\]")
_GROUPS_LIST = re.compile(r"replica_groups=\{\{(?P<first>[0-9,]*)\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[(?P<groups>\d+),(?P<size>\d+)\]")


def _array_bytes(text: str) -> list[int]:
    out = []
    for m in _ARRAY.finditer(text):
        if m["dtype"] in _BYTES:
            dims = [int(d) for d in m["dims"].split(",") if d]
            out.append(int(np.prod(dims, dtype=np.int64)) * _BYTES[m["dtype"]])
    return out


def _group_size(line: str, devices: int) -> int:
    if m := _GROUPS_IOTA.search(line):
        return int(m["size"])
    if (m := _GROUPS_LIST.search(line)) and m["first"]:
        return len(m["first"].split(","))
    return devices


def collectives(hlo_text: str, devices: int) -> dict[str, int]:
    """{kind: result bytes per device, ..., "moved": bytes sent per device} over the whole program text."""
    out = dict.fromkeys(KINDS, 0)
    moved = 0.0
    for line in hlo_text.splitlines():
        m = _OP.search(line)
        if not m:
            continue
        sizes = _array_bytes(m["type"])
        if not sizes:
            continue
        # An async start's tuple holds (operands..., results...): the results are the second half.
        result = sum(sizes[len(sizes) // 2 :]) if m["start"] and m["op"] != "all-reduce" else sum(sizes)
        n = _group_size(line, devices)
        out[m["op"]] += result
        moved += {
            "all-gather": result * (n - 1) / n, "reduce-scatter": result * (n - 1),
            "all-reduce": 2 * result * (n - 1) / n, "all-to-all": result * (n - 1) / n,
            "collective-permute": result,
        }[m["op"]]  # fmt: skip
    out["moved"] = int(moved)
    return out
