"""A protobuf-free reader of the profiler's `.xplane.pb` (an XSpace): planes, lines, events and their stats.

Only the fields a summary needs are read (tsl/profiler/protobuf/xplane.proto); the rest is skipped by wire type,
so a newer profiler's added fields do not break it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

StatValue = int | float | str | bytes


class XPlaneError(ValueError):
    """The bytes are not an XSpace (cut short, or another file)."""


@dataclass(frozen=True)
class XEvent:
    name: str
    start_ns: float
    duration_ns: float
    stats: dict[str, StatValue]


@dataclass
class XLine:
    name: str
    events: list[XEvent] = field(default_factory=list)


@dataclass
class XPlane:
    name: str
    lines: list[XLine] = field(default_factory=list)


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of one message: varints as int, fixed64/32 as int bits, others as bytes."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
            yield num, wt, v
        elif wt == 1:
            if i + 8 > n:
                raise XPlaneError("cut short")
            yield num, wt, struct.unpack_from("<Q", buf, i)[0]
            i += 8
        elif wt == 2:
            size, i = _varint(buf, i)
            if i + size > n:
                raise XPlaneError("cut short")
            yield num, wt, buf[i : i + size]
            i += size
        elif wt == 5:
            if i + 4 > n:
                raise XPlaneError("cut short")
            yield num, wt, struct.unpack_from("<I", buf, i)[0]
            i += 4
        else:
            raise XPlaneError(f"wire type {wt} at byte {i}: not an XSpace")


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise XPlaneError("cut short")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, i
        shift += 7


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _text(b: int | bytes) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else ""


def _map_entry(buf: bytes) -> tuple[int, bytes]:
    key, value = 0, b""
    for num, _, v in _fields(buf):
        if num == 1 and isinstance(v, int):
            key = _signed(v)
        elif num == 2 and isinstance(v, bytes):
            value = v
    return key, value


def _stat(buf: bytes, names: dict[int, str]) -> tuple[str, StatValue]:
    name: str = ""
    value: StatValue = 0
    for num, _, v in _fields(buf):
        if num == 1 and isinstance(v, int):
            name = names.get(_signed(v), "")
        elif num == 2 and isinstance(v, int):
            value = struct.unpack("<d", struct.pack("<Q", v))[0]
        elif num == 3 and isinstance(v, int):
            value = v
        elif num == 7 and isinstance(v, int):  # a string kept once, as a stat metadata's name
            value = names.get(v, "")
        elif num == 4 and isinstance(v, int):
            value = _signed(v)
        elif num == 5:
            value = _text(v)
        elif num == 6 and isinstance(v, bytes):
            value = v
    return name, value


def _plane(buf: bytes) -> XPlane:
    raw_lines: list[bytes] = []
    event_meta: dict[int, tuple[str, list[bytes]]] = {}
    stat_names: dict[int, str] = {}
    name = ""
    for num, _, v in _fields(buf):
        if num == 2:
            name = _text(v)
        elif num == 3 and isinstance(v, bytes):
            raw_lines.append(v)
        elif num == 4 and isinstance(v, bytes):
            key, meta = _map_entry(v)
            mname, display, mstats = "", "", []
            for mn, _, mv in _fields(meta):
                if mn == 2:
                    mname = _text(mv)
                elif mn == 4:
                    display = _text(mv)
                elif mn == 5 and isinstance(mv, bytes):
                    mstats.append(mv)
            event_meta[key] = (display or mname, mstats)
        elif num == 5 and isinstance(v, bytes):
            key, meta = _map_entry(v)
            stat_names[key] = next((_text(mv) for mn, _, mv in _fields(meta) if mn == 2), "")
    plane = XPlane(name)
    meta_stats = {k: dict(_stat(s, stat_names) for s in st) for k, (_, st) in event_meta.items()}
    for raw in raw_lines:
        plane.lines.append(_line(raw, event_meta, meta_stats, stat_names))
    return plane


def _line(
    buf: bytes,
    event_meta: dict[int, tuple[str, list[bytes]]],
    meta_stats: dict[int, dict[str, StatValue]],
    stat_names: dict[int, str],
) -> XLine:
    name, display, t0_ns, raw_events = "", "", 0, []
    for num, _, v in _fields(buf):
        if num == 2:
            name = _text(v)
        elif num == 11:
            display = _text(v)
        elif num == 3 and isinstance(v, int):
            t0_ns = _signed(v)
        elif num == 4 and isinstance(v, bytes):
            raw_events.append(v)
    line = XLine(display or name)
    for raw in raw_events:
        meta_id, offset_ps, dur_ps, stats = 0, 0, 0, []
        for num, _, v in _fields(raw):
            if num == 1 and isinstance(v, int):
                meta_id = _signed(v)
            elif num == 2 and isinstance(v, int):
                offset_ps = _signed(v)
            elif num == 3 and isinstance(v, int):
                dur_ps = _signed(v)
            elif num == 4 and isinstance(v, bytes):
                stats.append(v)
        own = dict(_stat(s, stat_names) for s in stats)
        line.events.append(
            XEvent(
                event_meta.get(meta_id, ("", []))[0],
                t0_ns + offset_ps / 1000,
                dur_ps / 1000,
                {**meta_stats.get(meta_id, {}), **own},
            )
        )
    return line


def read(data: bytes) -> list[XPlane]:
    """The planes of a serialized XSpace."""
    return [_plane(v) for num, _, v in _fields(data) if num == 1 and isinstance(v, bytes)]
