"""A profiler trace summarised: top ops by device time with their share, busy vs idle, steps and phases; and the
trace as trace-event JSON that the Perfetto UI opens.

Ops are the events of a device plane's op line (`/device:TPU:0` "XLA Ops"); on the CPU backend, where the host is
the device, the host's events that carry an `hlo_op` stat. Steps are the events with a `step_num` stat
(`jax.profiler.StepTraceAnnotation`), phases the host events named `phase/<name>` (`jax.profiler.TraceAnnotation`).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from tpuops.logs.xplane import XEvent, XPlane

PHASE_PREFIX = "phase/"
OP_LINES = ("XLA Ops", "Ops")


@dataclass(frozen=True)
class OpTime:
    name: str
    ms: float
    share: float  # of all ops' time
    count: int


@dataclass(frozen=True)
class TraceSummary:
    device: str  # TPU, GPU or CPU (the host, on the CPU backend)
    devices: int
    window_ms: float  # what the summary covers: the asked steps, else the whole capture
    busy_ms: float  # per device, on average: time with at least one op running
    ops: list[OpTime]
    steps: list[int] = field(default_factory=list)
    step_ms: float | None = None  # mean over the steps seen whole
    phases: dict[str, float] = field(default_factory=dict)  # phase -> ms over the window

    @property
    def busy_share(self) -> float:
        return self.busy_ms / self.window_ms if self.window_ms > 0 else 0.0

    def to_dict(self, top: int = 10) -> dict[str, object]:
        d: dict[str, object] = asdict(self)
        d["ops"] = [asdict(o) for o in self.ops[:top]]
        d["idle_ms"] = max(0.0, self.window_ms - self.busy_ms)
        d["busy_share"] = self.busy_share
        return d


def _device_planes(planes: list[XPlane]) -> list[tuple[str, list[list[XEvent]]]]:
    """(plane name, its op events line by line) per accelerator; the host as one device when no accelerator
    plane has ops."""
    out = []
    for p in planes:
        if p.name.startswith(("/device:TPU:", "/device:GPU:")) and "CUSTOM" not in p.name:
            lines = [ln.events for ln in p.lines if ln.name in OP_LINES and ln.events]
            if lines:
                out.append((p.name, lines))
    if out:
        return out
    host = [
        [e for e in ln.events if "hlo_op" in e.stats]
        for p in planes
        if p.name.startswith("/host:")
        for ln in p.lines
    ]
    return [("/host:CPU", [ln for ln in host if ln])]


def _host_events(planes: list[XPlane]) -> list[XEvent]:
    return [e for p in planes if p.name.startswith("/host:") for ln in p.lines for e in ln.events]


def _union_ns(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _self_times(lines: list[list[XEvent]]) -> list[tuple[XEvent, float]]:
    """Each op with its own time: less the ops nested inside it on the same line (a while loop's body ops)."""
    out: list[tuple[XEvent, float]] = []
    for line in lines:
        own: dict[int, float] = {}
        stack: list[XEvent] = []
        ordered = sorted(line, key=lambda e: (e.start_ns, -e.duration_ns))
        for e in ordered:
            while stack and e.start_ns >= stack[-1].start_ns + stack[-1].duration_ns:
                stack.pop()
            if stack:
                own[id(stack[-1])] -= min(
                    e.duration_ns, stack[-1].start_ns + stack[-1].duration_ns - e.start_ns
                )
            own[id(e)] = e.duration_ns
            stack.append(e)
        out += [(e, max(0.0, own[id(e)])) for e in ordered]
    return out


def summarise(planes: list[XPlane], steps: tuple[int, int] | None = None) -> TraceSummary:
    """The summary of one worker's trace; `steps` (first, last) narrows it to those steps' time."""
    devices = _device_planes(planes)
    host = _host_events(planes)
    step_events = [e for e in host if "step_num" in e.stats and e.duration_ns > 0]
    everything = [e for _, lines in devices for ln in lines for e in ln] + host
    if not everything:
        return TraceSummary("CPU", 0, 0.0, 0.0, [])
    lo = min(e.start_ns for e in everything)
    hi = max(e.start_ns + e.duration_ns for e in everything)
    if steps is not None:
        chosen = [e for e in step_events if steps[0] <= int(e.stats["step_num"]) <= steps[1]]
        if chosen:
            lo = min(e.start_ns for e in chosen)
            hi = max(e.start_ns + e.duration_ns for e in chosen)
        step_events = chosen

    def inside(e: XEvent) -> bool:
        return lo <= e.start_ns < hi

    per_op: dict[str, list[float]] = defaultdict(list)
    busy = 0.0
    for _, lines in devices:
        kept_lines = [[e for e in ln if inside(e)] for ln in lines]
        kept = [e for ln in kept_lines for e in ln]
        for e, own_ns in _self_times(kept_lines):
            per_op[e.name].append(own_ns)
        busy += _union_ns([(e.start_ns, min(hi, e.start_ns + e.duration_ns)) for e in kept])
    total = sum(sum(v) for v in per_op.values()) or 1.0
    ops = sorted(
        (OpTime(name, sum(v) / 1e6, sum(v) / total, len(v)) for name, v in per_op.items()),
        key=lambda o: (-o.ms, o.name),
    )
    # Steps seen whole (a capture starts and ends mid-step); their mean is the step time.
    whole = [e for e in step_events if inside(e) and e.start_ns + e.duration_ns <= hi]
    phases: dict[str, float] = defaultdict(float)
    for e in host:
        overlap = min(hi, e.start_ns + e.duration_ns) - max(lo, e.start_ns)
        if e.name.startswith(PHASE_PREFIX) and overlap > 0:  # a phase cut by the window counts its part in it
            phases[e.name[len(PHASE_PREFIX) :]] += overlap / 1e6
    kind = devices[0][0].split(":")[1] if devices[0][0].startswith("/device:") else "CPU"
    return TraceSummary(
        device=kind,
        devices=len(devices),
        window_ms=(hi - lo) / 1e6,
        busy_ms=busy / len(devices) / 1e6,
        ops=ops,
        steps=sorted({int(e.stats["step_num"]) for e in whole}),
        step_ms=sum(e.duration_ns for e in whole) / len(whole) / 1e6 if whole else None,
        phases=dict(sorted(phases.items(), key=lambda kv: -kv[1])),
    )


def trace_json(planes: list[XPlane]) -> bytes:
    """The trace as gzipped trace-event JSON (one process per plane, one thread per line): Perfetto opens it."""
    events: list[dict[str, object]] = []
    starts = [e.start_ns for p in planes for ln in p.lines for e in ln.events]
    t0 = min(starts) if starts else 0.0
    for pid, plane in enumerate(planes, start=1):
        if not any(ln.events for ln in plane.lines):
            continue
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": plane.name}})
        for tid, line in enumerate(plane.lines, start=1):
            if not line.events:
                continue
            events.append(
                {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": line.name or "-"}}
            )
            for e in line.events:
                args = {k: v if isinstance(v, int | float | str) else v.hex() for k, v in e.stats.items()}
                events.append(
                    {
                        "ph": "X",
                        "pid": pid,
                        "tid": tid,
                        "name": e.name,
                        "ts": round((e.start_ns - t0) / 1e3, 3),
                        "dur": round(e.duration_ns / 1e3, 3),
                        **({"args": args} if args else {}),
                    }
                )
    body = json.dumps({"displayTimeUnit": "ns", "traceEvents": events}, separators=(",", ":"))
    return gzip.compress(body.encode(), mtime=0)


def parse_steps(text: str) -> tuple[int, int]:
    """`5-7` or `5` -> (first, last); a ValueError names the form."""
    first, sep, last = text.strip().partition("-")
    try:
        a, b = int(first), int(last) if sep else int(first)
    except ValueError:
        raise ValueError(f"steps must be A-B or N (for example 5-7), received {text!r}") from None
    if a < 0 or b < a:
        raise ValueError(f"steps must be A-B with 0 <= A <= B (for example 5-7), received {text!r}")
    return a, b
