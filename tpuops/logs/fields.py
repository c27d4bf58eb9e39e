"""A step line's numbers: the line -> StepRow (the trainer's named fields and any other numeric `key=value`), and
which of them a table or the live view shows (the log's own fields, the first few, or the user's `columns`)."""

from __future__ import annotations

import re

from tpuops.errors import UsageError
from tpuops.logs.events import CHIP_FIELDS, CHIP_LISTS, StepRow

# The step line's `key=value` tokens (the trainer's form: docs/contracts.md section 2).
KV = re.compile(r"(?P<k>[A-Za-z_][\w.]*)=(?P<v>\S+)")
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
# Every other numeric field after another format's step number: `loss=0.31`, `acc: 0.9`, `lr=1e-4`, `update=0.3s`.
NUM_KV = re.compile(rf"(?<![\w.])(?P<k>[A-Za-z_][\w.]*)\s*[=:]\s*(?P<v>{_NUMBER})(?P<s>s)?(?![\w.:%/-])")
# The trainer's own names also as `key value` (`loss 0.31`), as older logs print them.
LOOSE_KV = re.compile(
    r"(?<![\w.])(?P<k>rollout_generate|update|reward_mean|loss|tokens_per_s)\s+"
    rf"(?P<v>{_NUMBER})(?P<s>s)?(?![\w.:%/-])"
)
# The step's duration (scanner.DT_ANY reads it): shown as `dt`, never as a field of its own.
DT_NAMES = frozenset({"dt", "step_time", "time", "step_s", "elapsed"})

# Every number of the trainer's step line the step table keeps (StepRow); the per-chip lists apart.
STEP_LISTS = CHIP_LISTS
STEP_FIELDS = tuple(f for f in StepRow.__dataclass_fields__ if f not in ("step", "extra", *STEP_LISTS))
MAX_EXTRA = 32  # other numeric fields kept per row (a line of a thousand `k=v` must not blow the memory)
MAX_FIELDS = 64  # distinct field names a report lists
DEFAULT_COLUMNS = 8  # the first this many fields of the step lines are shown when no `columns` are given
NOT_SHOWN = frozenset({*CHIP_FIELDS, *CHIP_LISTS})  # the chips have their own section and charts


def kv(text: str) -> dict[str, str]:
    return {m["k"]: m["v"] for m in KV.finditer(text)}


def num(v: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(v.removesuffix("s"))
        except ValueError:
            pass
    return v


def floats(text: str | None) -> list[float] | None:
    """`10.10/12.30` (one value per chip) -> [10.1, 12.3]; None when absent or not numbers."""
    if not text:
        return None
    try:
        return [float(x) for x in text.split("/")]
    except ValueError:
        return None


def _put(row: StepRow, order: list[str], name: str, value: float) -> None:
    if name in STEP_FIELDS:
        if getattr(row, name) is None:
            setattr(row, name, value)
    elif name not in row.extra and len(row.extra) < MAX_EXTRA:
        row.extra[name] = value
    else:
        return
    order.append(name)


def parse(line: bytes | tuple[int, float | None, str]) -> tuple[StepRow, list[str]] | None:
    """A step line's row and the names of its numeric fields in the line's order (`dt` where its duration is).
    `line`: the trainer's `step=` line, or another format's (step, dt, the text after the step number)."""
    order: list[str] = []
    if isinstance(line, tuple):
        step, dt, rest = line
        row = StepRow(step=step, dt=dt)
        found = sorted([*NUM_KV.finditer(rest), *LOOSE_KV.finditer(rest)], key=lambda m: m.start())
        for m in found:
            if m["k"] in DT_NAMES:
                if dt is not None and "dt" not in order:
                    order.append("dt")
                continue
            _put(row, order, m["k"], float(m["v"]))
        if dt is not None and "dt" not in order:  # a duration from the group `dt`, timestamps or the clock
            order.insert(0, "dt")
        return row, order
    fields = kv(line.decode(errors="replace"))
    try:
        row = StepRow(step=int(fields.pop("step")))
    except (KeyError, ValueError):
        return None
    for name, text in fields.items():
        if name in STEP_LISTS:
            setattr(row, name, floats(text))
            continue
        v = num(text)
        if isinstance(v, int | float) and not isinstance(v, bool):
            _put(row, order, name, float(v))
    return row, order


def row(line: bytes | tuple[int, float | None, str]) -> StepRow | None:
    parsed = parse(line)
    return None if parsed is None else parsed[0]


def value(r: StepRow, name: str) -> float | None:
    """A field of a row by name: the trainer's named ones, else the line's other numbers."""
    if name in STEP_FIELDS:
        v = getattr(r, name)
        return v if isinstance(v, int | float) else None
    return r.extra.get(name)


def parse_columns(text: object) -> list[str] | None:
    """`--set columns=loss,acc` (or a list): the fields a steps table and the live rows show, in that order.
    None when not given; a name that cannot be a field is exit 2."""
    if text is None or text in ("", []):
        return None
    names = [str(n).strip() for n in (text if isinstance(text, list | tuple) else str(text).split(","))]
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z_][\w.]*", n)]
    if bad or not names:
        raise UsageError(
            f"columns: {bad[0] if bad else text!r} is not a field name",
            hint="name the step lines' fields, comma-separated: --set columns=loss,dt,acc",
        )
    return list(dict.fromkeys(names))


def pick(fields: list[str], chosen: list[str] | None = None, limit: int = DEFAULT_COLUMNS) -> list[str]:
    """The columns shown: the user's `columns`, else the first `limit` fields of the step lines (the chips'
    fields have their own section)."""
    if chosen:
        return list(chosen)
    return [f for f in fields if f not in NOT_SHOWN][:limit]


def check_columns(fields: list[str], chosen: list[str] | None) -> None:
    """A chosen column the log's step lines never have is exit 2 naming the fields they have."""
    missing = [c for c in chosen or [] if c not in fields]
    if missing:
        have = ", ".join(f for f in fields if f not in NOT_SHOWN) or "no numeric fields"
        raise UsageError(f"column {missing[0]!r} is not a field of the log's step lines (they have: {have})")
