"""Glue shared by commands: the --json switch for error output, and run-a-SOP-then-render."""

from __future__ import annotations

import typer

from tpuops.config import TargetSpec


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
    force: bool = False,
    keep_going: bool = False,
    parallel: int | None = None,
    recover: int | None = None,
    skip_fit: bool = False,
    unreachable_s: float | None = None,
) -> None:
    from tpuops import console
    from tpuops.run import launch, report

    finish_json(json)
    req = launch.RunRequest(
        sop=name,
        sets=sets,
        target=spec,
        worker=worker,
        dry_run=dry_run,
        force=force,
        keep_going=keep_going,
        parallel=parallel,
        skip_fit=skip_fit,
    )
    on_step = None if json else report.step_done
    if not dry_run and (recover is not None or _on_a_vm(spec)):
        from tpuops.run import recover as recovery

        # On a VM the run is always watched through the TPU API: a preempted VM ends it at once (exit 8);
        # with --recover it is recreated and the SOP runs again.
        result = recovery.run_with_recovery(
            req,
            max_recoveries=recover or 0,
            unreachable_s=unreachable_s,
            on_line=console.line,
            on_step=on_step,
            on_event=console.event,
            notify=console.note,
        )
    else:
        result = launch.run(req, on_line=console.line, on_step=on_step)
    if isinstance(result, launch.DryRun):
        report.dry_run(result, json)
        return
    code = launch.exit_code(result)
    report.sop_report(result, int(code), json)
    raise typer.Exit(int(code))


def _on_a_vm(spec: TargetSpec) -> bool:
    from pathlib import Path

    from tpuops import config

    return spec.with_defaults(config.load(Path.cwd())).kind == "vm"
