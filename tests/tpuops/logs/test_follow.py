"""The follower: the scanner's typed events from a worker's log, hang detection on step events, attach's end."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tpuops.logs.events import Compile, Event, ExitEvent, Failure, StepEvent
from tpuops.logs.follow import Follower, HangWatch
from tpuops.logs.scanner import LogScanner
from tpuops.shell import Redactor
from tpuops.sop.actions import Fetch, Follow
from tpuops.transport.base import Kind
from tpuops.transport.local import LocalTransport


def events(*lines: str | bytes) -> list[Event]:
    got: list[Event] = []
    scanner = LogScanner(on_event=got.append)
    for line in lines:
        scanner.feed(line.decode() if isinstance(line, bytes) else line)
    return got


def steps(*lines: str | bytes) -> list[StepEvent]:
    return [e for e in events(*lines) if isinstance(e, StepEvent)]


def test_the_scanner_hands_out_steps_compiles_failures_in_line_order() -> None:
    got = events(
        "Compiling jit(train_step) with global shapes and types ...",
        "step=0 loss=0.1 dt=5.00s",
        "step=1 loss=0.1 dt=0.50s",
        "step=oops",  # malformed: still a step line (a step finished), without step or dt
        "RESOURCE_EXHAUSTED: out of memory while allocating",
        "Traceback (most recent call last):",
        '  File "t.py", line 3, in f',
        "ValueError: bad",
    )
    kinds = [type(e).__name__ for e in got]
    assert kinds == ["Compile", "StepEvent", "StepEvent", "StepEvent", "Failure", "Failure"], kinds
    compile_, s0, s1, bad, oom, tb = got
    assert isinstance(compile_, Compile) and compile_.function == "train_step" and compile_.line == 1
    assert (s0, s1) == (StepEvent(0, 0, 5.0, 2), StepEvent(0, 1, 0.5, 3))
    assert bad == StepEvent(0, None, None, 4)
    assert isinstance(oom, Failure) and oom.kind == "oom" and oom.line == 5
    assert isinstance(tb, Failure) and tb.kind == "traceback" and tb.message == "ValueError: bad"
    scanner = LogScanner(worker=3, on_event=got.append)
    scanner.exit(2)
    assert got[-1] == ExitEvent(3, 2) and scanner.report().exit_codes == {3: 2}


def test_many_step_lines_in_one_feed_are_each_an_event_with_its_line_number() -> None:
    text = "\n".join(f"step={i} dt=0.10s" for i in range(50)) + "\nnoise\nstep=50 dt=0.20s\n"
    got: list[Event] = []
    scanner = LogScanner(on_event=got.append)
    scanner.feed_bytes(text.encode()[:333])  # a chunk that ends mid-line: that line waits
    scanner.feed_bytes(text.encode()[333:])
    assert [(e.step, e.line) for e in got if isinstance(e, StepEvent)] == [
        *((i, i + 1) for i in range(50)),
        (50, 52),
    ]


def _watch(**kw: float) -> HangWatch:
    return HangWatch(
        Follow("~/runs/x", hang_factor=kw.get("factor", 10), hang_min_s=kw.get("min_s", 1.0)), now=0
    )


def test_hang_bound_before_a_median_is_the_longest_step_so_far() -> None:
    # One step line (step 0: 5 s, its compile included), then silence: hung after max(min, 10 x 5 s).
    w = _watch(min_s=1.0)
    assert w.check(steps("step=0 loss=0.1 dt=5.00s"), now=5.0) is None
    assert w.check([], now=5.0 + 49) is None
    hung = w.check([], now=5.0 + 51)
    assert (
        hung is not None and "after step 0" in hung and "longest step 5.00s" in hung and "limit 50s" in hung
    )
    assert w.check([], now=200) is None  # said once until a new step line comes


def test_three_steps_then_silence_is_hung_from_the_steady_steps() -> None:
    # 3 step lines 0.8 s apart, then alive and silent (was: followed until the timeout).
    w = _watch(min_s=1.0)
    for i, t in enumerate((0.8, 1.6, 2.4)):
        assert w.check(steps(f"step={i} dt=0.80s"), now=t) is None
    assert w.limit()[0] == 8.0  # 10 x the steady step (step 2), over hang_min_s
    assert w.check([], now=2.4 + 7.9) is None
    assert "median step 0.80s" in (w.check([], now=2.4 + 8.1) or "")


def test_many_step_lines_in_one_poll_count_as_steps_with_their_own_dt() -> None:
    w = _watch(min_s=0.5)
    assert (
        w.check(steps(*(f"step={i} dt=0.10s" for i in range(6))), now=0.6) is None
    )  # their dt=, not the gap
    assert w.limit()[0] == 1.0  # max(0.5, 10 x 0.1)
    assert w.check(steps("noise"), now=1.5) is None
    assert w.check([], now=1.7) is not None


def test_a_malformed_step_line_still_counts_with_the_arrival_gap() -> None:
    w = _watch(min_s=0.1, factor=2)
    w.check(steps("step=0 dt=1.00s"), now=1.0)
    w.check(steps("step=garbled"), now=4.0)  # no dt: the 3 s since the last step line stand in
    assert w.steps == [(0, 1.0), (1, 3.0)] and w.limit()[0] == 6.0


def test_hang_min_s_is_the_floor_and_nothing_is_hung_before_the_first_step() -> None:
    w = _watch(min_s=30.0)
    assert w.check(steps("Compiling jit(train_step) ..."), now=1000) is None  # no step yet: the timeout rules
    w.check(steps("step=0 dt=0.01s"), now=1000)
    assert w.limit()[0] == 10_000.0  # step 0 came 1000 s after the follow began: its compile counts
    w = _watch(min_s=30.0)
    w.check(steps("step=0 dt=0.01s"), now=0.01)
    assert w.limit()[0] == 30.0
    assert w.check([], now=30) is None and w.check([], now=30.02) is not None


def test_the_follower_shows_lines_resumes_at_its_offset_and_hands_out_the_exit(tmp_path: Path) -> None:
    t = LocalTransport(tmp_path / "vm", 2)
    run = tmp_path / "vm" / "w1" / "runs" / "r1"
    run.mkdir(parents=True)
    log = run / "worker-1.log"
    log.write_text("step=0 dt=0.10s\nwandb: ERROR api_key not configured (SECRET123)\nstep=1 dt=0.1")
    shown: list[tuple[int, str]] = []
    got: list[Event] = []
    follower = Follower(
        t, redact=Redactor(["SECRET123"]), on_line=lambda w, s: shown.append((w, s)), on_event=got.append
    )
    action = Follow("~/runs/r1", stream="all", timeout=30, poll_s=0.02)

    def finish() -> None:
        time.sleep(0.2)
        with log.open("a") as f:
            f.write("0s\nstep=2 dt=0.10s\nlast words")  # completes step=1; the job ends mid-line
        (run / "worker-1.exit").write_text("3\n")

    threading.Thread(target=finish).start()
    r = follower.follow(1, action, threading.Event())
    assert r.ok and r.job_exit == 3 and r.kind is Kind.OK
    assert [s for _, s in shown] == [
        "step=0 dt=0.10s",
        "wandb: ERROR api_key not configured (***)",
        "step=1 dt=0.10s",
        "step=2 dt=0.10s",
        "last words",
    ]
    assert [e.step for e in got if isinstance(e, StepEvent)] == [0, 1, 2]
    (failure,) = [e for e in got if isinstance(e, Failure)]
    assert failure.kind == "wandb_init" and "SECRET123" not in failure.message
    assert got[-1] == ExitEvent(1, 3)
    assert follower.offsets[1] == log.stat().st_size
    # A second follow from the saved offset shows nothing twice.
    shown.clear()
    again = Follower(t, on_line=lambda w, s: shown.append((w, s)), offsets=dict(follower.offsets))
    assert again.follow(1, action, threading.Event()).ok and shown == []
    fetched = again.fetch(1, Fetch("~/runs/r1"), tmp_path / "local")
    assert fetched.ok and (tmp_path / "local" / "r1" / "worker-1.exit").read_text() == "3\n"
