"""A compiled program's HLO text: its computations, how many times each runs per execution of the program
(loop-aware), and its collectives.

Runs per execution (`Module.counts`): the entry runs once; a while loop's body runs (its caller's count x
the trip count) and its condition one more time than that; a fusion's, a reduction's or a called
computation's body runs as often as its caller; every branch of a conditional is counted as running (an
upper bound: one of them does). The trip count is XLA's `known_trip_count` when the while carries one (the
GPU and CPU compilers print it; libtpu does not), else read off the loop when it is the scan / fori_loop
pattern libtpu leaves: the condition's ROOT is `compare(counter, constant N)` (LT, LE, GT or GE), the
counter starts at a constant in the while's init tuple and the body's ROOT tuple adds a constant to it; a
ROOT `and` of such a test and a test of data (`i < N and not done`: the sampler's decode segments) runs N
times, its upper bound. A loop whose trip count cannot be read at all runs `unknown_trips` times, 1 unless the
caller knows better (trainer.fit.programs: the decode loop's C - 1 tokens, so that what the decode program
does once, outside its loop, counts once).
A computation nothing calls counts once (also a fragment of text without an ENTRY).

Collectives: result bytes per kind and the bytes each device moves over ICI (ring algorithms: all-gather
R(n-1)/n, reduce-scatter R(n-1), all-reduce 2R(n-1)/n), each times the runs of the computation it sits in. An
all-reduce whose fusion returns only this device's slice of it (libtpu's reduce-scatter) is a reduce-scatter.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
          "f64": 8, "s64": 8, "u64": 8, "c64": 8, "f8e4m3fn": 1, "f8e5m2": 1}  # fmt: skip
_COMPUTATION = re.compile(r"^(?P<entry>ENTRY )?%(?P<name>\S+) \(.*\{$")
_INSTRUCTION = re.compile(
    r"^\s+(?:ROOT )?%(?P<name>\S+) = (?P<type>\(.*?\)|\S+) (?P<op>[a-z][a-z0-9\-]*)\((?P<args>.*?)\)(?:, |$)"
)
_OPERAND = re.compile(r"%(?P<name>[\w.\-]+)")
_ARRAY = re.compile(r"(?P<dtype>[a-z]+[0-9a-z]*)\[(?P<dims>[0-9,]*)\]")
_CALLEE = re.compile(
    r"\b(?P<how>calls|to_apply|body|condition|true_computation|false_computation|select|scatter)"
    r"=%(?P<name>[\w.\-]+)"
)
_CALLEES = re.compile(r"\b(?:branch_computations|called_computations)=\{(?P<names>[^}]*)\}")
_KNOWN_TRIPS = re.compile(r'"known_trip_count":\{"n":"(?P<n>\d+)"')
_CONSTANT = re.compile(r"^-?\d+$")
_INDEX = re.compile(r"\bindex=(?P<i>\d+)")
_DIRECTION = re.compile(r"\bdirection=(?P<d>[A-Z]+)")
# Ops whose callees run as top-level code (their ops are the program's); any other op's callee (a fusion,
# a reduction's to_apply, an async start's wrapped op) is part of that op.
CONTROL = frozenset({"while", "conditional", "call"})
# Single-operand ops that pass a scalar counter or bound through unchanged.
_VIEWS = frozenset({"copy", "bitcast", "convert", "reshape"})
_CONTEXT = re.compile(r"\bu32\[\]")  # an async permute's context scalar in its start's tuple
_GROUPS_LIST = re.compile(r"replica_groups=\{\{(?P<first>[0-9,]*)\}")
_GROUPS_IOTA = re.compile(
    r"replica_groups=\[(?P<groups>\d+),(?P<size>\d+)\]<=\[(?P<dims>[0-9,]+)\](?:T\((?P<perm>[0-9,]+)\))?"
)
_GROUPS_MESH = re.compile(
    r"replica_groups=mesh\[(?P<axes>[^\]]*)\](?:, device_ids=\(\[(?P<dims>[0-9,]+)\](?:T\((?P<perm>[0-9,]+)\))?\))?"
    r"(?: \{(?P<over>[^}]*)\})?"
)


class Instruction(NamedTuple):
    name: str
    type: str
    op: str
    args: str  # the operands' text
    line: str


@dataclass(frozen=True)
class Module:
    computations: dict[str, list[Instruction]]  # name -> instructions, in text order
    counts: dict[str, int]  # name -> runs per execution of the program
    nested: frozenset[str]  # bodies of fusions, reductions, async ops: their ops belong to their caller


def callees(line: str) -> list[tuple[str, str]]:
    """(how, computation) for every computation an instruction calls: how is calls, to_apply, body, ..."""
    out = [(m["how"], m["name"]) for m in _CALLEE.finditer(line)]
    for m in _CALLEES.finditer(line):
        out += [("branch", n["name"]) for n in _OPERAND.finditer(m["names"])]
    return out


def parse(hlo_text: str, unknown_trips: int = 1) -> Module:
    """The computations of an HLO module text and how many times each runs (a loop whose trip count cannot
    be read: `unknown_trips`)."""
    computations: dict[str, list[Instruction]] = {}
    entry = None
    current: list[Instruction] = computations.setdefault("", [])  # instructions before any header
    for line in hlo_text.splitlines():
        if m := _COMPUTATION.match(line):
            current = computations.setdefault(m["name"], [])
            entry = m["name"] if m["entry"] else entry
        elif m := _INSTRUCTION.match(line):
            current.append(Instruction(m["name"], m["type"], m["op"], m["args"], line))
    if not computations[""]:
        del computations[""]
    callers: dict[str, list[tuple[str, int]]] = defaultdict(list)  # callee -> [(caller, runs per caller run)]
    nested = set()
    for caller, body in computations.items():
        defs = {i.name: i for i in body}
        for ins in body:
            for how, callee in callees(ins.line):
                runs = 1
                if ins.op == "while":
                    n = trip_count(computations, defs, ins)
                    runs = unknown_trips if n is None else n if how == "body" else n + 1
                callers[callee].append((caller, runs))
                if ins.op not in CONTROL:
                    nested.add(callee)

    @cache
    def count(name: str) -> int:
        if name == entry or not callers[name]:
            return 1
        return sum(count(caller) * runs for caller, runs in callers[name])

    return Module(computations, {name: count(name) for name in computations}, frozenset(nested))


def _through_views(defs: dict[str, Instruction], name: str) -> Instruction | None:
    ins = defs.get(name)
    while ins is not None and ins.op in _VIEWS:
        operand = _OPERAND.search(ins.args)
        ins = defs.get(operand["name"]) if operand else None
    return ins


def _constant(defs: dict[str, Instruction], name: str) -> int | None:
    ins = _through_views(defs, name)
    if ins is None or ins.op != "constant" or not _CONSTANT.match(ins.args.strip()):
        return None
    return int(ins.args)


def _tuple_index(defs: dict[str, Instruction], name: str) -> int | None:
    """k when `name` is element k of the computation's parameter (a loop's state)."""
    ins = _through_views(defs, name)
    if ins is None or ins.op != "get-tuple-element":
        return None
    operand, index = _OPERAND.search(ins.args), _INDEX.search(ins.line)
    if operand is None or index is None:  # not the shape get-tuple-element always has
        return None
    source = _through_views(defs, operand["name"])
    return int(index["i"]) if source is not None and source.op == "parameter" else None


def operands(ins: Instruction) -> list[str]:
    return [m["name"] for m in _OPERAND.finditer(ins.args)]


def _root(body: list[Instruction]) -> Instruction | None:
    return next((i for i in body if i.line.lstrip().startswith("ROOT ")), body[-1] if body else None)


def trip_count(
    computations: dict[str, list[Instruction]],
    defs: dict[str, Instruction],
    loop: Instruction,
    compare: Instruction | None = None,
) -> int | None:
    """How many times a while loop runs its body (see the module docstring), None when unknown; `defs` are
    the instructions of the computation that holds the loop; `compare`, the condition's test to read (default:
    its ROOT; a ROOT `and` of tests gives the smallest bound any of them reads, an upper bound)."""
    if m := _KNOWN_TRIPS.search(loop.line):
        return int(m["n"])
    named = dict(callees(loop.line))
    cond, body = computations.get(named.get("condition", "")), computations.get(named.get("body", ""))
    if not cond or not body or not (compare := compare or _root(cond)):
        return None
    cond_defs = {i.name: i for i in cond}
    if compare.op == "and":  # `counter < N and not done`: N is an upper bound (the loop may stop sooner)
        bounds = [
            trip_count(computations, defs, loop, cond_defs[o]) for o in operands(compare) if o in cond_defs
        ]
        known = [n for n in bounds if n is not None]
        return min(known) if known else None
    if compare.op != "compare":
        return None
    direction = _DIRECTION.search(compare.line)
    ops = operands(compare)
    if direction is None or len(ops) != 2:
        return None
    flip = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}
    k, bound, d = _tuple_index(cond_defs, ops[0]), _constant(cond_defs, ops[1]), direction["d"]
    if k is None:  # bound on the left: N > counter
        k, bound, d = _tuple_index(cond_defs, ops[1]), _constant(cond_defs, ops[0]), flip.get(d, d)
    init = _through_views(defs, operands(loop)[0]) if operands(loop) else None
    if k is None or bound is None or d not in flip or init is None or init.op != "tuple":
        return None
    start = _constant(defs, operands(init)[k]) if k < len(operands(init)) else None
    step = _step(body, k)
    if start is None or not step or (step > 0) != (d in ("LT", "LE")):
        return None
    end = bound + (1 if d == "LE" else -1 if d == "GE" else 0)  # the first value that stops the loop
    return max(0, math.ceil((end - start) / step))


def _step(body: list[Instruction], k: int) -> int | None:
    """What the loop body adds to state element k each iteration (a chain of adds of constants), or None."""
    defs = {i.name: i for i in body}
    root = _root(body)
    if root is None or root.op != "tuple" or k >= len(operands(root)):
        return None
    step, name = 0, operands(root)[k]
    while (ins := _through_views(defs, name)) is not None and ins.op == "add" and len(operands(ins)) == 2:
        a, b = operands(ins)
        if (c := _constant(defs, b)) is not None:
            name = a
        elif (c := _constant(defs, a)) is not None:
            name = b
        else:
            return None
        step += c
    return step if _tuple_index(defs, name) == k else None


def module(text: str | Module) -> Module:
    """`text` parsed, unless it already is."""
    return parse(text) if isinstance(text, str) else text


def _array_bytes(text: str) -> list[int]:
    return [math.prod(int(d) for d in m["dims"].split(",") if d) * _BYTES[m["dtype"]]
            for m in _ARRAY.finditer(text) if m["dtype"] in _BYTES]  # fmt: skip


def _iota(n: int, dims: str | None, perm: str | None) -> list[int]:
    """XLA's iota device list: 0..n-1 laid out as `dims`, transposed by `perm`, read in order."""
    ids = list(range(n))
    if not dims:
        return ids
    shape = [int(d) for d in dims.split(",")]
    order = [int(p) for p in perm.split(",")] if perm else list(range(len(shape)))
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    out_shape = [shape[i] for i in order]
    out = []
    for flat in range(n):
        index, rest = [], flat
        for size in reversed(out_shape):
            index.append(rest % size)
            rest //= size
        index.reverse()
        out.append(sum(index[k] * strides[order[k]] for k in range(len(order))))
    return out


def group_members(line: str, devices: int) -> list[int]:
    """The devices (partition ids) of a collective's first replica group; every device when none is named.

    Forms libtpu writes: `{{0,1},{2,3}}`, the iota `[4,2]<=[8]` / `[2,4]<=[4,2]T(1,0)` (groups x size over an
    iota laid out as dims and transposed), and `mesh['axis_0'=4,'axis_1'=2] {'axis_0'}` (devices laid out as
    the named axes, optionally as `device_ids=([4,2]T(1,0))`; a group spans the axes in braces)."""
    if (m := _GROUPS_LIST.search(line)) and m["first"]:
        return [int(i) for i in m["first"].split(",")]
    if m := _GROUPS_IOTA.search(line):
        groups, size = int(m["groups"]), int(m["size"])
        return _iota(groups * size, m["dims"], m["perm"])[:size]
    if m := _GROUPS_MESH.search(line):
        sizes = [(name, int(n)) for name, n in re.findall(r"'([^']*)'=(\d+)", m["axes"])]
        total = math.prod(n for _, n in sizes)
        ids = _iota(total, m["dims"], m["perm"])
        over = set(re.findall(r"'([^']*)'", m["over"] or "")) or {name for name, _ in sizes}
        members = []
        for flat in range(total):  # row-major over the named axes; the group: other axes at 0
            index, rest = {}, flat
            for name, n in reversed(sizes):
                index[name] = rest % n
                rest //= n
            if all(index[name] == 0 for name, _ in sizes if name not in over):
                members.append(ids[flat])
        return members
    return list(range(devices))


def _group_size(line: str, devices: int) -> int:
    return len(group_members(line, devices))


class CollectiveOp(NamedTuple):
    name: str
    kind: str  # one of KINDS
    result_bytes: int  # per run, per device
    moved_bytes: float  # per run: what each device sends (ring algorithms)
    group: tuple[int, ...]  # the first replica group's devices (partition ids)
    runs: int  # runs per execution of the program


def collective_ops(text: str | Module, devices: int) -> list[CollectiveOp]:
    """Every collective of the program, with its bytes, its group and how many times it runs."""
    mod = module(text)
    out = []
    for name, body in mod.computations.items():
        scattered = _scattered(body) if name in mod.nested else None
        for ins in body:
            kind = ins.op.removesuffix("-start")
            if kind not in KINDS or not (sizes := _array_bytes(ins.type)):
                continue
            if ins.name == scattered:  # libtpu's reduce-scatter: what each device keeps is its result
                kind, sizes = "reduce-scatter", [s // len(group_members(ins.line, devices)) for s in sizes]
            # An async start's tuple holds (operands..., results...): the results are the second half. A permute's
            # start also carries u32[] context scalars (libtpu: operand, result, u32[], u32[]), which are not data.
            start = ins.op.endswith("-start") and kind != "all-reduce"
            if start and kind == "collective-permute":
                sizes = sizes[: max(len(sizes) - len(_CONTEXT.findall(ins.type)), 2)]
            result = sum(sizes[len(sizes) // 2 :]) if start else sum(sizes)
            group = tuple(group_members(ins.line, devices))
            n = len(group)
            moved = {
                "all-gather": result * (n - 1) / n, "reduce-scatter": result * (n - 1),
                "all-reduce": 2 * result * (n - 1) / n, "all-to-all": result * (n - 1) / n,
                "collective-permute": result,
            }[kind]  # fmt: skip
            out.append(CollectiveOp(ins.name, kind, result, moved, group, mod.counts[name]))
    return out


def _scattered(body: list[Instruction]) -> str | None:
    """The all-reduce of a fused reduce-scatter: a fusion body whose ROOT is a dynamic-slice of an all-reduce
    (libtpu's `all-reduce-scatter` fusion, emitter SingleInputAllReduceScatterFusion: a ring that sends each
    device only its own slice, the bytes of a reduce-scatter; an all-reduce whose slice is taken by a separate
    op outside it is a whole all-reduce)."""
    root = next((i for i in body if i.line.lstrip().startswith("ROOT ")), None)
    if root is None or root.op != "dynamic-slice" or not (operand := _OPERAND.search(root.args)):
        return None
    source = next((i for i in body if i.name == operand["name"]), None)
    return source.name if source is not None and source.op == "all-reduce" else None


def collectives(text: str | Module, devices: int) -> dict[str, int]:
    """{kind: result bytes per device, ..., "moved": bytes sent per device} over one execution of the program
    (each collective times the runs of its computation)."""
    out = dict.fromkeys(KINDS, 0)
    moved = 0.0
    for op in collective_ops(text, devices):
        out[op.kind] += op.runs * op.result_bytes
        moved += op.runs * op.moved_bytes
    out["moved"] = int(moved)
    return out
