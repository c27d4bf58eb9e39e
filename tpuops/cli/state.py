"""Glue shared by commands: the --json switch for error output, and run-a-SOP-then-render."""

from __future__ import annotations

import typer

from tpuops.targets import TargetSpec

JSON_MODE = {"on": False}


def finish_json(on: bool) -> None:
    """Remember --json so the top-level error handler answers in JSON too."""
    JSON_MODE["on"] = on


def run_sop(
    name: str,
    sets: dict[str, str],
    spec: TargetSpec,
    *,
    worker: str,
    dry_run: bool,
    json: bool,
    force: bool = False,
    keep_going: bool = False,
    parallel: int | None = None,
    recover: int | None = None,
) -> None:
    from tpuops import report, runner

    finish_json(json)
    req = runner.RunRequest(
        sop=name,
        sets=sets,
        target=spec,
        worker=worker,
        dry_run=dry_run,
        force=force,
        keep_going=keep_going,
        parallel=parallel,
    )
    on_step = None if json else report.step_done
    if recover is not None and not dry_run:
        from tpuops import recovery

        result = recovery.run_with_recovery(
            req, max_recoveries=recover, on_line=report.line, on_step=on_step, on_event=report.event
        )
    else:
        result = runner.run(req, on_line=report.line, on_step=on_step)
    if isinstance(result, runner.DryRun):
        report.dry_run(result, json)
        return
    code = runner.exit_code(result)
    report.sop_report(result, int(code), json)
    raise typer.Exit(int(code))
