"""What a run returns: one frozen RunResult, its exit code computed once from the steps and the log (a dry run:
the plan, exit code 0)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NotRequired, TypedDict

from tpuops.errors import ExitCode
from tpuops.logs.events import LogReport
from tpuops.run.estimate import Estimate, compare
from tpuops.run.target import Target
from tpuops.sop.executor import Plan, Preview, SopReport, StepReport
from tpuops.sop.model import Outcome

if TYPE_CHECKING:
    from tpuops.run.profile import Profiled


class Recovery(TypedDict):
    """One VM recreation of a --recover run: when, why, how long, the last step seen, the step resumed at (None
    until the next attempt's first step line), the steps run again, the attempt's run id; after a preemption
    notice also its checkpoint's step."""

    at: float
    why: str
    duration_s: float
    last_step: int | None
    resumed_step: int | None
    steps_lost: int | None
    run_id: str
    notice: NotRequired[bool]
    notice_checkpoint: NotRequired[int | None]


@dataclass(frozen=True)
class Planned:
    """What a dry run (--dry-run) found instead of running: the SOP's values, every worker's plan, the fit
    preflight's verdict, the target it resolved (a later run of the same request may reuse it), and what the
    workers were read to have (git sync's local edits; empty with --offline)."""

    values: dict[str, object]
    plan: Plan
    fit: str | None = None  # the fit preflight's verdict line
    target: Target | None = None
    preview: list[Preview] = field(default_factory=list)


@dataclass(frozen=True)
class RunResult:
    """A finished run, built once at its end (run/launch) and never changed afterwards: the executor's step
    report, the run's log report, the VM recoveries (--recover), what to try next, and the exit code. The
    CLI renders it; the run's saved result.json is its `to_dict()`. A dry run is one too: `planned` set, no
    step ran (the report has none), exit code 0."""

    report: SopReport
    code: ExitCode
    log: LogReport | None = None
    recoveries: tuple[Recovery, ...] = ()
    hint: str | None = None  # what to try next, for failures with a known fix (an out-of-memory)
    estimate: Estimate | None = None  # the fit preflight's cost and predicted peak HBM (a VM run)
    planned: Planned | None = None  # a dry run: the plan instead of a run
    profile: Profiled | None = None  # --profile-steps: the job's trace of those steps, summarised per worker
    vm_lost: str | None = None  # the VM went under the run (exit 8): how, at which step (`hint`: what to do)

    @property
    def sop(self) -> str:
        return self.report.sop

    @property
    def run_id(self) -> str:
        return self.report.run_id

    @property
    def transport(self) -> str:
        return self.report.transport

    @property
    def workers(self) -> list[int]:
        return self.report.workers

    @property
    def steps(self) -> list[StepReport]:
        return self.report.steps

    @property
    def duration_s(self) -> float:
        return self.report.duration_s

    @property
    def ok(self) -> bool:
        return self.code == ExitCode.OK

    def first_failure(self) -> tuple[StepReport, int, Outcome] | None:
        return self.report.first_failure()

    def error_line(self) -> str | None:
        """A run that ended as an error ends (its VM lost): the one line, what happened (what to do)."""
        if self.vm_lost is None:
            return None
        return f"{self.vm_lost} ({self.hint})" if self.hint else self.vm_lost

    def to_dict(self) -> dict[str, object]:
        """The --json report and the run's saved result (a dry run's: its plan); holds no secret (details
        are redacted, and secrets never reach a plan: they travel in .env files)."""
        if self.planned is not None:
            return self._plan_dict(self.planned)
        return {
            **self.report.to_dict(int(self.code)),
            "hint": self.hint,
            "recoveries": list(self.recoveries),
            "log": None if self.log is None else self.log.to_dict(),
            "estimate": self.estimate,
            "against_fit": None if self.log is None else compare(self.estimate, self.log),
            "profile": None if self.profile is None else self.profile.to_dict(),
            # A lost VM: as an error's JSON says it (`error`, `message`), beside the steps and recoveries.
            **({} if self.vm_lost is None else {"error": "preempted", "message": self.error_line()}),
        }

    def _plan_dict(self, p: Planned) -> dict[str, object]:
        vm = p.target.vm if p.target is not None else None
        return {
            "sop": self.sop,
            "transport": self.transport,
            "workers": self.workers,
            "values": p.values,
            "fit": p.fit,
            # Which VM the plan is for and which API serves it (`api`: tpu or compute; `kind`: node, instance, mig).
            **({"vm": {"name": vm.name, "zone": vm.zone, "api": vm.api, "kind": vm.kind,
                       "accelerator_type": vm.accelerator_type, "workers": len(vm.workers)}} if vm else {}),
            "estimate": self.estimate,
            "plan": [
                {"step": title, "workers": {str(w): [a.render() for a in acts] for w, acts in per.items()}}
                for title, per in p.plan
            ],
            # What the workers were read to have (unless --offline): git sync's files it would discard.
            "preview": [
                {"step": x.step, "worker": x.worker, "says": x.words[0], "found": x.found, "error": x.error}
                for x in p.preview
            ],
        }  # fmt: skip


LOG_FAILURE_CODES = {"oom": ExitCode.OOM, "tpu_busy": ExitCode.TPU_BUSY}


def exit_code(
    report: SopReport, log: LogReport | None = None, *, fail_on_recompile: bool = False
) -> ExitCode:
    """The process exit code for a finished SOP (see README: Exit codes): the first failed step, the log's
    cause, or a recompile the SOP fails on. A run Ctrl-C detached from (or interrupted before its job
    started) is 130."""
    if report.interrupted:
        return ExitCode.INTERRUPTED
    failure = report.first_failure()
    cause = log.cause() if log is not None else None
    if failure is None:
        if cause is not None:
            return LOG_FAILURE_CODES.get(cause.kind, ExitCode.FAILED)
        if unverified(log, fail_on_recompile):
            return ExitCode.UNVERIFIED  # fail closed: a check that saw nothing never says ok
        if log is not None and fail_on_recompile and log.recompiled:
            return ExitCode.RECOMPILE
        return ExitCode.OK
    step, worker, outcome = failure
    if step.kind == "preflight":  # the consistency check refused to start the run
        return ExitCode.INCONSISTENT
    kind = step.error_kind.get(worker)
    if kind in {"connect", "host_key"}:
        return ExitCode.CONNECT
    if kind == "usage":  # bad input only the worker could see (a branch the remote does not have)
        return ExitCode.USAGE
    if kind == "no_space":  # a worker's disk was full where tpuops had to write (git sync's stash)
        return ExitCode.RESOURCE
    codes = {"busy": ExitCode.TPU_BUSY, "timeout": ExitCode.TIMEOUT, "hang": ExitCode.HANG}
    if outcome.status == "failed" and cause is not None:
        return LOG_FAILURE_CODES.get(cause.kind, ExitCode.FAILED)
    return codes.get(str(outcome.status), ExitCode.FAILED)


NO_STEP_LINE = (
    "no step line seen, so compiles after the warm-up cannot be told apart: tpuops reads `step=N`, `step: N`, "
    "`Step N/M` and `[step N]` (docs/logs.md); for other lines pass --set step_pattern='REGEX' with a group "
    "(?P<step>\\d+)"
)
NO_COMPILE_LOG = (
    "JAX compile logging not seen: is `JAX_LOG_COMPILES=1` reaching the program? (tpuops sets it for the job; "
    "a program or .env that turns jax_log_compiles off, or a logging setup that drops jax's WARNING lines, "
    "hides it)"
)


def unverified(log: LogReport | None, fail_on_recompile: bool) -> str | None:
    """Why a recompile check (`fail_on_recompile`) cannot judge its run, with the fix; None when it can (or
    when the SOP checks no recompile)."""
    if not fail_on_recompile:
        return None
    if log is None or not log.steps:
        return NO_STEP_LINE
    if not log.compiles.get("total"):
        return NO_COMPILE_LOG
    return None
