"""Glue shared by commands: the --json switch for error output, and run-a-SOP-then-render."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from tpuops.config import TargetSpec
    from tpuops.run.launch import RunRequest
    from tpuops.run.result import RunResult


def finish_json(on: bool) -> None:
    """Remember --json so the top-level error handler answers in JSON too (tpuops.console keeps it)."""
    from tpuops import console

    console.json_mode(on)


def run_sop(
    name: str,
    sets: dict[str, str],
    spec: TargetSpec,
    *,
    worker: str,
    dry_run: bool,
    json: bool,
    verbose: bool = False,
    offline: bool = False,
    force: bool = False,
    keep_going: bool = False,
    parallel: int | None = None,
    recover: int | None = None,
    skip_fit: bool = False,
    unreachable_s: float | None = None,
    command: tuple[str, ...] = (),
) -> None:
    from tpuops.run import launch

    finish_json(json)
    req = launch.RunRequest(
        sop=name,
        sets=sets,
        target=spec,
        worker=worker,
        dry_run=dry_run,
        inspect=dry_run and not offline,
        offline=dry_run and offline,
        force=force,
        keep_going=keep_going,
        parallel=parallel,
        skip_fit=skip_fit,
        command=command,
    )
    result = _followed(req, json, recover, unreachable_s)
    _render(result, json, verbose)


def _followed(req: RunRequest, json: bool, recover: int | None, unreachable_s: float | None) -> RunResult:
    """One library call: it loads the config, resolves the target once and decides the VM watch itself.
    At a terminal the run is followed under a status line (phase, step N/total, elapsed, ETA, reward)."""
    from tpuops import console
    from tpuops.logs.fields import parse_columns
    from tpuops.logs.progress import Progress
    from tpuops.run import launch, report

    detach = threading.Event()  # the first Ctrl-C: stop following, the job goes on
    live_view = (
        Progress(columns=parse_columns(req.sets.get("columns"))) if console.live_wanted(json) else None
    )
    with detach_on_sigint(detach), console.Live(live_view) as live:
        return launch.start(
            req,
            max_recoveries=recover,
            unreachable_s=unreachable_s,
            on_line=live.line,
            on_step=None if json else report.step_done,
            on_phase=live.phase,
            on_notice=console.event,
            notify=console.note,
            detach=detach,
        )


def _render(result: RunResult, json: bool, verbose: bool) -> None:
    """A run's answer: a dry run's plan (exit 0), or the line after Ctrl-C and the run's report, its exit code."""
    from tpuops import console
    from tpuops.run import report

    if result.planned is not None:  # --dry-run: the plan, exit 0
        report.dry_run(result, json, verbose=verbose)
        return
    if result.vm_lost is not None:
        lost_vm(result, json)
    if result.report.interrupted:
        console.event(
            interrupted_line(result.run_id, result.report.interrupted, result.report.stopped_at_end)
        )
    if json or not result.report.interrupted:
        report.sop_report(result, json)
    raise typer.Exit(int(result.code))


def lost_vm(result: RunResult, json: bool) -> NoReturn:
    """A run whose VM was lost (exit 8): one error line, as any error ends; under --json the run's report (its
    steps, its recoveries, `error` and `message` as an error's JSON has them) instead of the bare error."""
    from tpuops import console
    from tpuops.run import report

    line = result.error_line() or ""
    if json:
        report.sop_report(result, True)
        console.json_mode(False)  # the report above is the JSON answer: the error line goes to stderr alone
    console.error(line, int(result.code), "preempted")
    raise typer.Exit(int(result.code))


def interrupted_line(run_id: str, how: str, stopped: dict[int, str] | None = None) -> str:
    """The one line after Ctrl-C: where the job is and the two commands that reach it again."""
    if how == "detached":
        return (
            f"detached: run {run_id} is still running on the workers; "
            f"follow it again with `tpuops attach {run_id}`, stop it with `tpuops stop {run_id}`"
        )
    if stopped:
        where = ", ".join(f"w{w}" for w in sorted(stopped))
        return (
            f"interrupted before the job started: stopped {sorted(stopped.values())[0]} on {where}; "
            f"nothing of run {run_id} was left running on the workers"
        )
    return f"interrupted before the job started: nothing of run {run_id} was left running on the workers"


@contextlib.contextmanager
def detach_on_sigint(detach: threading.Event) -> Iterator[None]:
    """The first Ctrl-C sets `detach` (following stops within a poll, the job goes on); a second one
    interrupts tpuops at once (KeyboardInterrupt, exit 130)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def first(signum: int, frame: object) -> None:
        if detach.is_set():
            raise KeyboardInterrupt
        detach.set()

    before = signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
