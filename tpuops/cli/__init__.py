"""The Typer CLI: wiring only (options -> one library call -> render). Heavy imports stay inside commands."""

from __future__ import annotations

import os
import sys

import typer

from tpuops.cli import emulator, runs, sop, vm
from tpuops.cli.fit import fit
from tpuops.cli.report import report
from tpuops.cli.state import JSON_MODE

app = typer.Typer(
    name="tpuops",
    help="Run TPU-VM procedures (SOPs) on every worker: git-sync, clear the TPU lock, sync .env, run, follow.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: typer.rich_utils alone costs ~0.2 s of start-up
    add_completion=False,
)
app.add_typer(sop.app, name="sop")
runs.register(app)
app.command("runs")(runs.runs)
app.command("attach")(runs.attach)
app.command("logs")(runs.logs)
app.command("stop")(runs.stop)
app.command("doctor")(runs.doctor)
app.add_typer(runs.bench_app, name="bench")
app.add_typer(vm.app, name="vm")
app.add_typer(emulator.app, name="emulator")
app.command("report")(report)
app.command("fit")(fit)


def main() -> None:
    """Entry point: one actionable line per error and a fixed exit code; tracebacks only with TPUOPS_DEBUG=1."""
    import click

    from tpuops.errors import ExitCode, TpuopsError

    try:
        # Without standalone mode click returns a command's typer.Exit code instead of exiting.
        code = app(standalone_mode=False)
    except TpuopsError as e:
        if os.environ.get("TPUOPS_DEBUG") == "1":
            raise
        from tpuops import report

        report.error(e.line(), int(e.exit_code), JSON_MODE["on"], e.kind)
        sys.exit(int(e.exit_code))
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(int(ExitCode.USAGE))
    except click.exceptions.Abort:
        sys.exit(int(ExitCode.FAILED))
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
