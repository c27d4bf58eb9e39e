"""What an executed SOP returns: each step's outcome per worker (StepReport), the SOP's (SopReport), a dry run's
read-only look at one worker (Preview)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpuops.errors import error_class
from tpuops.sop.model import Outcome
from tpuops.sop.status import FAILED
from tpuops.transport.base import CmdResult


@dataclass
class StepReport:
    title: str
    kind: str
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    results: dict[int, list[CmdResult]] = field(default_factory=dict)
    duration_s: float = 0.0
    error_kind: dict[int, str] = field(default_factory=dict)  # worker -> TpuopsError.kind

    @property
    def failed(self) -> dict[int, Outcome]:
        return {w: o for w, o in sorted(self.outcomes.items()) if o.status in FAILED}


@dataclass
class SopReport:
    sop: str
    run_id: str
    transport: str
    workers: list[int]
    steps: list[StepReport] = field(default_factory=list)
    duration_s: float = 0.0
    # Ctrl-C: "detached" (the job goes on; attach/stop it by its run id) or "interrupted" (before any job
    # started: nothing was left running); None when the SOP ran to its end.
    interrupted: str | None = None
    # What the end of the SOP stopped on a worker that a step of this run still ran there (Ctrl-C during a git
    # sync: "step git_sync of run R"), by worker.
    stopped_at_end: dict[int, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(not s.failed for s in self.steps)

    def to_dict(self, code: int) -> dict[str, object]:
        """The steps' part of the --json report (run/launch's RunResult adds the log, hint and recoveries);
        holds no secret: details are redacted."""
        failure = self.first_failure()
        return {
            "sop": self.sop,
            "run_id": self.run_id,
            "transport": self.transport,
            "workers": self.workers,
            "ok": code == 0,
            "exit_code": code,
            "failure": None
            if failure is None
            else {
                "step": failure[0].title,
                "worker": failure[1],
                "status": failure[2].status,
                "detail": failure[2].detail,
            },
            "duration_s": round(self.duration_s, 3),
            "steps": [
                {
                    "title": s.title,
                    "kind": s.kind,
                    "duration_s": round(s.duration_s, 3),
                    "workers": {
                        str(w): {"status": o.status, "detail": o.detail, **o.data}
                        for w, o in sorted(s.outcomes.items())
                    },
                }
                for s in self.steps
            ],
            "error_class": error_class(code),
            "interrupted": self.interrupted,
        }

    def first_failure(self) -> tuple[StepReport, int, Outcome] | None:
        for s in self.steps:
            for w, o in s.failed.items():
                if o.status != "cancelled":
                    return s, w, o
        return None


@dataclass(frozen=True)
class Preview:
    """What a dry run read, read-only, on one worker for one step (git sync: the files it would discard)."""

    step: str
    worker: int
    found: list[str]
    error: str | None = None  # the worker could not be read: why (the plan stands; this part is unknown)
    words: tuple[str, str] = ("found", "nothing found")  # the step's preview_words

    def line(self) -> str:
        if self.error is not None:
            return f"w{self.worker} {self.step}: not read ({self.error})"
        shown = ", ".join(f.strip() for f in self.found[:20]) + (
            f" and {len(self.found) - 20} more" if len(self.found) > 20 else ""
        )
        return (
            f"w{self.worker} {self.step}: {self.words[0]}: {shown}"
            if self.found
            else (f"w{self.worker} {self.step}: {self.words[1]}")
        )
