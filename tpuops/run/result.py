"""What a run returns: one frozen RunResult, its exit code computed once from the steps and the log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tpuops.errors import ExitCode
from tpuops.logs.events import LogReport
from tpuops.run.estimate import compare
from tpuops.sop.executor import SopReport, StepReport
from tpuops.sop.model import Outcome

# One VM recreation of a --recover run: when, why, how long, the last step seen, the step resumed at.
Recovery = dict[str, Any]


@dataclass(frozen=True)
class RunResult:
    """A finished run, built once at its end (run/launch) and never changed afterwards: the executor's step
    report, the run's log report, the VM recoveries (--recover), what to try next, and the exit code. The
    CLI renders it; the run's saved result.json is its `to_dict()`."""

    report: SopReport
    code: ExitCode
    log: LogReport | None = None
    recoveries: tuple[Recovery, ...] = ()
    hint: str | None = None  # what to try next, for failures with a known fix (an out-of-memory)
    estimate: dict[str, Any] | None = None  # the fit preflight's cost and predicted peak HBM (a VM run)

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

    def to_dict(self) -> dict[str, Any]:
        """The --json report and the run's saved result; holds no secret (details are redacted)."""
        return {
            **self.report.to_dict(int(self.code)),
            "hint": self.hint,
            "recoveries": list(self.recoveries),
            "log": None if self.log is None else self.log.to_dict(),
            "estimate": self.estimate,
            "against_fit": None if self.log is None else compare(self.estimate, self.log),
        }


_LOG_FAILURE_CODES = {"oom": ExitCode.OOM, "tpu_busy": ExitCode.TPU_BUSY}


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
            return _LOG_FAILURE_CODES.get(cause.kind, ExitCode.FAILED)
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
    codes = {"busy": ExitCode.TPU_BUSY, "timeout": ExitCode.TIMEOUT, "hang": ExitCode.HANG}
    if outcome.status == "failed" and cause is not None:
        return _LOG_FAILURE_CODES.get(cause.kind, ExitCode.FAILED)
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
