"""The log actions a plan holds: follow the workers' logs, fetch them back (rendered the same for --dry-run)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Follow:
    """Stream worker logs from a byte offset until every exit file exists or the timeout passes."""

    run_dir: str
    stream: str = "all"  # "all" workers' lines, or "first" (process 0 only; all are still watched)
    timeout: float = 3600.0
    poll_s: float = 0.5
    # Hang detection on process 0's `step=` lines: no new one within max(hang_min_s, hang_factor x the
    # expected step time): the median steady step after hang_warmup steps, before that the longest step so
    # far (step 0 holds the compile). 0 turns it off.
    hang_factor: float = 0.0
    hang_warmup: int = 2
    hang_min_s: float = 60.0
    on_hang: str = "stop"  # stop: fail the step; wait: report and keep following
    py_spy: bool = False  # on a hang, collect `py-spy dump` of the job's Python process

    def render(self) -> str:
        hang = (
            f", hang after {self.hang_factor:g}x median step (min {self.hang_min_s:g}s)"
            if self.hang_factor
            else ""
        )
        return f"follow {self.run_dir}/worker-<k>.log until worker-<k>.exit (timeout {self.timeout:g}s{hang})"


@dataclass(frozen=True)
class Fetch:
    """Copy worker logs back to the local run directory."""

    run_dir: str

    def render(self) -> str:
        return f"fetch {self.run_dir}/worker-<k>.log -> local run directory"
