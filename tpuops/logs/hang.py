"""The hang watch of a follow: process 0 is hung when no step line came for longer than its steps take."""

from __future__ import annotations

import statistics
import time

from tpuops.logs.actions import Follow
from tpuops.logs.events import StepEvent


class HangWatch:
    """Calls process 0 hung when no new step came within max(hang_min_s, hang_factor x expected step).

    Fed the scanner's step events (every `step=` line, however many one poll brings), timed from the last
    one. The expected step time is the median time per steady step (after hang_warmup steps): each step's
    own `dt=`, or the time between its line and the one before when that is longer (work between steps
    counts). Before any steady step exists, the longest step so far stands in (step 0's time holds the
    compile), so a stall right after the first step line is still caught. Before the first step line only
    the timeout applies.
    """

    def __init__(self, action: Follow, now: float | None = None) -> None:
        self.action = action
        self.last: float | None = None  # when the latest step line arrived
        self.first_seen = time.monotonic() if now is None else now
        self.steps: list[tuple[int, float]] = []  # (step, seconds it took), in arrival order
        self.reported = False

    def check(self, steps: list[StepEvent], now: float | None = None) -> str | None:
        """The step events one poll brought (maybe none); a reason when the worker looks hung."""
        now = time.monotonic() if now is None else now
        for e in steps:
            step = e.step if e.step is not None else (self.steps[-1][0] + 1 if self.steps else 0)
            # Arrival gaps mean something only for a poll that brought one step line.
            since = now - (self.last if self.last is not None else self.first_seen)
            took = max(e.dt or 0.0, since if len(steps) == 1 or e.dt is None else 0.0)
            self.steps.append((step, took))
            self.last, self.reported = now, False
        if self.last is None or self.reported:
            return None
        limit, how = self.limit()
        quiet = now - self.last
        if quiet <= limit:
            return None
        self.reported = True
        return f"no step line for {quiet:.0f}s after step {self.steps[-1][0]} ({how}, limit {limit:.0f}s)"

    def limit(self) -> tuple[float, str]:
        a = self.action
        steady = [t for _, t in self.steps[a.hang_warmup :]]
        if steady:
            expected, how = statistics.median(steady), f"median step {statistics.median(steady):.2f}s"
        else:
            expected = max(t for _, t in self.steps)
            how = f"no steady step yet, longest step {expected:.2f}s"
        return max(a.hang_factor * expected, a.hang_min_s), how
