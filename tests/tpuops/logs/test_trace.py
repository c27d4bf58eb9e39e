"""The profiler trace reader and its summary, on a real recorded trace of the bundled trainer (steps 3-4 of the
arith preset on CPU: tests/tpuops/fixtures/profile/README.md)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tpuops.logs import trace, xplane
from tpuops.logs.xplane import XEvent, XLine, XPlane

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "profile" / "arith-steps-3-4.xplane.pb.gz"


@pytest.fixture(scope="module")
def raw() -> bytes:
    return gzip.decompress(FIXTURE.read_bytes())


def test_the_reader_agrees_with_jaxlibs_own(raw: bytes) -> None:
    profile_data = pytest.importorskip("jaxlib._profile_data")
    theirs = profile_data.ProfileData.from_serialized_xspace(raw)
    ours = xplane.read(raw)
    seen = 0
    for a, b in zip(ours, theirs.planes, strict=True):
        assert a.name == b.name
        for la, lb in zip(a.lines, b.lines, strict=True):
            assert la.name == lb.name
            for ea, eb in zip(la.events, lb.events, strict=True):
                assert ea.name == eb.name
                assert ea.start_ns == pytest.approx(eb.start_ns, abs=1)
                assert ea.duration_ns == pytest.approx(eb.duration_ns, abs=1)
                assert ea.stats == {k: v for k, v in eb.stats if k}
                seen += 1
    assert seen > 1000


def test_summary_of_the_recorded_steps(raw: bytes) -> None:
    s = trace.summarise(xplane.read(raw))
    assert s.device == "CPU" and s.devices == 1
    assert len(s.ops) >= 3 and [o.ms for o in s.ops] == sorted((o.ms for o in s.ops), reverse=True)
    assert sum(o.share for o in s.ops) == pytest.approx(1.0)
    assert 0 < s.busy_ms <= s.window_ms
    assert s.steps == [3, 4] and s.step_ms is not None and s.step_ms < s.window_ms
    assert {"rollout", "score", "update", "record"} <= set(s.phases)
    assert sum(s.phases.values()) <= s.window_ms * 1.001
    one = trace.summarise(xplane.read(raw), (4, 4))  # narrowed to one step: its own time only
    assert one.steps == [4] and one.window_ms < s.window_ms and one.window_ms == pytest.approx(one.step_ms)
    d = s.to_dict(top=3)
    assert len(d["ops"]) == 3 and d["idle_ms"] == pytest.approx(s.window_ms - s.busy_ms)


def test_a_nested_op_counts_only_its_own_time() -> None:
    """A while loop's body ops run inside it on the same line: the loop keeps only the time they do not cover."""

    def op(name: str, start: float, dur: float) -> XEvent:
        return XEvent(name, start, dur, {"hlo_op": name})

    line = XLine(
        "thread", [op("while.1", 0, 100), op("dot.2", 10, 30), op("add.3", 50, 20), op("exp.4", 200, 50)]
    )
    s = trace.summarise([XPlane("/host:CPU", [line])])
    assert {o.name: o.ms * 1e6 for o in s.ops} == pytest.approx(
        {"while.1": 50, "dot.2": 30, "add.3": 20, "exp.4": 50}
    )
    assert s.busy_ms * 1e6 == pytest.approx(150) and s.window_ms * 1e6 == pytest.approx(250)


def test_trace_json_opens_as_trace_events(raw: bytes) -> None:
    planes = xplane.read(raw)
    body = json.loads(gzip.decompress(trace.trace_json(planes)))
    spans = [e for e in body["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == sum(len(ln.events) for p in planes for ln in p.lines)
    assert min(e["ts"] for e in spans) == 0 and all(e["dur"] >= 0 for e in spans)
    names = {e["args"]["name"] for e in body["traceEvents"] if e["name"] == "process_name"}
    assert "/host:CPU" in names


def test_bytes_that_are_not_a_trace_are_refused(raw: bytes) -> None:
    with pytest.raises(xplane.XPlaneError):
        xplane.read(raw[: len(raw) // 2])
    with pytest.raises(xplane.XPlaneError):
        xplane.read(b"\x0f\xff\xff")


@pytest.mark.parametrize(("text", "want"), [("5-7", (5, 7)), ("3", (3, 3)), (" 0-0 ", (0, 0))])
def test_steps_ranges(text: str, want: tuple[int, int]) -> None:
    assert trace.parse_steps(text) == want


@pytest.mark.parametrize("text", ["7-5", "a-b", "-1", ""])
def test_bad_steps_ranges_say_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="A-B"):
        trace.parse_steps(text)
