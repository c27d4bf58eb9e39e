"""The end of a run, judged once: from its log report (and a followed run's steps, or the VM lost under it), the
exit code, the words people read and what to try next; then its record (`result.json`). `run`, `attach`,
`report RUN_ID`, `bench` and a recovery all ask `judge`, so a run read any way gets one verdict."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuops.errors import ExitCode
from tpuops.logs.events import STOPPED, LogReport, exit_status
from tpuops.run.baseline import Delta
from tpuops.run.result import exit_code, unverified
from tpuops.sop.executor import SopReport

if TYPE_CHECKING:
    from tpuops.logs.follow import Readings
    from tpuops.run.estimate import Estimate
    from tpuops.run.profile import Profiled
    from tpuops.run.result import RunResult
    from tpuops.sop.loader import Sop

WORDS = {ExitCode.OK: "ok", ExitCode.RECOMPILE: "recompiles after warm-up", ExitCode.STOPPED: "stopped"}


@dataclass(frozen=True)
class Verdict:
    """How a run ended: its exit code, what to try next (a known fix), and the workers `tpuops stop` ended."""

    code: ExitCode
    hint: str | None = None
    stopped: tuple[int, ...] = ()
    vm_lost: str | None = None  # how the VM was lost under the run (exit 8), as the error line says it

    def error_line(self) -> str | None:
        """A run that ends as an error ends (its VM lost): the one line, what happened (what to do)."""
        if self.vm_lost is None:
            return None
        return f"{self.vm_lost} ({self.hint})" if self.hint else self.vm_lost

    @property
    def words(self) -> str:
        """What people read: ok, stopped, recompiles after warm-up, failed."""
        return words(self.code)


def words(code: int) -> str:
    return WORDS.get(ExitCode(code), "failed") if code in ExitCode._value2member_map_ else "failed"


def stopped_workers(run_dir: Path) -> set[int]:
    """The workers whose fetched exit file (`worker-<k>.exit` in a local run folder) says `tpuops stop` (or a
    `--force` run) ended their job: `143 stopped`."""
    out = set()
    for p in run_dir.glob("worker-*.exit"):
        k = p.name[len("worker-") : -len(".exit")]
        try:
            notes = exit_status(p.read_bytes())[1]
        except OSError:
            continue
        if k.isdigit() and STOPPED in notes:
            out.add(int(k))
    return out


@dataclass(frozen=True)
class VmLoss:
    """The VM lost under a run, as its watch saw it: what happened (`what`: the VM, why, at which step) and what
    to do (`hint`: rerun with --recover, or, when the recoveries ran out, another zone)."""

    what: str
    hint: str


def finished(
    sop: Sop,
    values: dict[str, object],
    report: SopReport,
    reads: Readings,
    *,
    accelerator: str | None,
    estimate: Estimate | None = None,
    profiled: Profiled | None = None,
) -> RunResult:
    """A followed run's end: its logs scanned once (`scan`), its verdict (`judge`), its record (`save`)."""
    from tpuops.config import state_home
    from tpuops.run.result import RunResult

    local_run = state_home() / "runs" / report.run_id
    log = None if sop.scan is None else scan(sop, report, reads, local_run)
    verdict = judge(
        log, steps=report, stopped=stopped_workers(local_run),
        fail_on_recompile=sop.scan is not None and sop.scan.fail_on_recompile,
        config=str(values.get("config") or "CONFIG"), accelerator=accelerator,
    )  # fmt: skip
    result = RunResult(report, verdict.code, log, hint=verdict.hint, estimate=estimate, profile=profiled)
    save(result)
    return result


def scan(sop: Sop, report: SopReport, reads: Readings, local_run: Path) -> LogReport | None:
    """The run's log report: from the scanners its follow and fetch fed (`source: log`; the logs are not read
    again), or from each worker's output of the steps (`source: stdout`, a SOP with no job log)."""
    from tpuops.run import scan as scans

    assert sop.scan is not None
    if sop.scan.source == "log":
        log = reads.report()  # the workers whose whole log was read; None: no log was
        return None if log is None else scans.run_report(log, local_run)
    scanners: dict[int, scans.LogScanner] = {}
    for step in report.steps:
        for w, results in sorted(step.results.items()):
            scanner = scanners.setdefault(
                w, scans.LogScanner(warmup=reads.warmup, worker=w, step_pattern=reads.step_pattern)
            )
            for r in results:
                for line in r.stdout.splitlines():
                    scanner.feed(line)
    parts = [s.close() for _, s in sorted(scanners.items())]
    return scans.merge(parts) if parts else None


def judge(
    log: LogReport | None,
    *,
    steps: SopReport | None = None,
    vm_lost: VmLoss | None = None,
    stopped: Iterable[int] = (),
    lost: bool = False,
    hung: bool = False,
    fail_on_recompile: bool = False,
    deltas: list[Delta] | None = None,
    config: str | None = None,
    accelerator: str | None = None,
) -> Verdict:
    """The one verdict of a finished run.

    A run that `tpuops stop` ended (`stopped`: those workers' exit files say so) and where no worker had
    failed on its own is `stopped` (exit 14), however its jobs died of the signal. Otherwise a followed run
    (`steps`, its step report) is judged by its steps and its log (`result.exit_code`); a run read from its
    logs alone (`attach`, `report RUN_ID`) by its log with the same rule (`_from_log`): an out-of-memory 10, a TPU
    held by another process 4, other failure signatures or a baseline regression 1, compiles after the warm-up 7
    where the run fails on them (`fail_on_recompile`: a recompile check), a job that stopped making progress
    (`hung`) 9, and a worker that could not be followed (`lost`) is never ok. A recompile check that saw nothing
    to judge is 13; an out-of-memory names the fix in `hint`, read any way. A VM lost under the run
    (`vm_lost`) is exit 8 whatever its steps said (they failed because it went), with its own hint."""
    if vm_lost is not None:
        return Verdict(ExitCode.PREEMPTED, vm_lost.hint, vm_lost=vm_lost.what)
    halted = tuple(sorted(set(stopped) | _stopped_steps(steps)))
    if halted and not _failed_on_its_own(log, steps, halted):
        return Verdict(ExitCode.STOPPED, None, halted)
    if steps is not None:
        code = exit_code(steps, log, fail_on_recompile=fail_on_recompile)
        hint = oom_hint(config or "CONFIG", accelerator) if code == ExitCode.OOM else None
        if code == ExitCode.UNVERIFIED:
            hint = unverified(log, fail_on_recompile)
        return Verdict(code, hint, halted)
    code = _from_log(log, deltas, fail_on_recompile)
    if hung and code in (ExitCode.OK, ExitCode.FAILED):  # a job that made no progress: as a followed run says
        code = ExitCode.HANG
    if lost and code == ExitCode.OK:
        code = ExitCode.FAILED
    hint = unverified(log, fail_on_recompile) if code == ExitCode.OK else None
    if hint:  # a recompile check that saw no step line or no compile logging: never ok (as when it ran)
        code = ExitCode.UNVERIFIED
    if code == ExitCode.OOM:
        hint = oom_hint(config or "CONFIG", accelerator)
    return Verdict(code, hint, halted)


def _from_log(log: LogReport | None, deltas: list[Delta] | None, fail_on_recompile: bool) -> ExitCode:
    """A run's code from its log alone, by the rule a followed run's log is judged by (`result.exit_code`): its
    cause (an out-of-memory 10, a TPU held by another process 4, another failure 1), a baseline regression 1,
    compiles after the warm-up 7 where the run fails on them."""
    from tpuops.run.result import LOG_FAILURE_CODES

    if log is None:
        return ExitCode.FAILED
    cause = log.cause()
    if cause is not None:
        return LOG_FAILURE_CODES.get(cause.kind, ExitCode.FAILED)
    if log.failed or any(d.regressed for d in deltas or []):
        return ExitCode.FAILED
    if fail_on_recompile and log.recompiled:
        return ExitCode.RECOMPILE
    return ExitCode.OK


def oom_hint(config: str, accelerator: str | None) -> str:
    """What to do about an out-of-memory: find a batch that fits this accelerator before spending a VM on it."""
    return (
        f"find a batch that fits: tpuops fit {config} --accelerator {accelerator or 'TYPE'} "
        "--set train.micro_batch=... (a smaller train.micro_batch, or more gradient accumulation)"
    )


def _stopped_steps(steps: SopReport | None) -> set[int]:
    """The workers whose run step saw its job end by `tpuops stop` (the exit file's note, as the follow read it)."""
    if steps is None:
        return set()
    return {w for s in steps.steps for w, o in s.outcomes.items() if o.data.get("stopped") is True}


def _failed_on_its_own(log: LogReport | None, steps: SopReport | None, stopped: Collection[int]) -> bool:
    """Whether some worker failed before or apart from the stop: a job that exited non-zero (or left no exit
    file) without being stopped, or a step that failed for another reason than the stop."""
    if log is not None and any(c != 0 and w not in stopped for w, c in log.exit_codes.items()):
        return True
    failure = steps.first_failure() if steps is not None else None
    return failure is not None and failure[2].data.get("stopped") is not True


def named(values: Mapping[str, object], estimate: Estimate | None) -> tuple[str | None, str | None]:
    """The config and accelerator a run's hint names (`judge`'s keywords), from its record."""
    est: Estimate = estimate or {}
    config = values.get("config") or est.get("config")
    accelerator = est.get("accelerator")
    return (str(config) if config else None), (str(accelerator) if accelerator else None)


def judge_runs(runs: Sequence[RunResult], *, need_log: bool = False) -> Verdict:
    """Several runs read as one (`bench`'s variants, one after another): the verdict of the first that is not
    ok, as `judge` gave it when that run ended; with `need_log`, a run that read no log (nothing to compare) is
    failed."""
    for r in runs:
        if not r.ok:
            return Verdict(r.code, r.hint, vm_lost=r.vm_lost)
    if need_log and (blind := [r.run_id for r in runs if r.log is None]):
        return Verdict(
            ExitCode.FAILED, f"no log was read for run {blind[0]}: `tpuops logs {blind[0]}` shows it"
        )
    return Verdict(ExitCode.OK)


def save(result: RunResult) -> None:
    """The run's record of its end (`result.json` in its local run folder): its verdict, steps, log report and
    recoveries. A run that never started (no run record: nothing ran) has none."""
    from tpuops.config import state_home
    from tpuops.run.store import save_result

    if (state_home() / "runs" / result.run_id / "run.json").is_file():
        save_result(result.run_id, result.to_dict())
