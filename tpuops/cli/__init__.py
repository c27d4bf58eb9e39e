"""The Typer CLI: wiring only (options -> one library call -> render). Heavy imports stay inside commands."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from tpuops.cli import emulator, runs, sop, vm
from tpuops.cli.command import App
from tpuops.cli.fit import fit
from tpuops.cli.profile import profile
from tpuops.cli.report import report

app = App(
    name="tpuops",
    help="Run TPU-VM procedures (SOPs) on every worker: git-sync, clear the TPU lock, sync .env, run, follow.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: typer.rich_utils alone costs ~0.2 s of start-up
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    # -h as --help; help text as wide as the terminal (to 120 columns) so descriptions are not cut at 80.
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        commit = checkout_commit(Path(__file__).resolve().parents[2])
        typer.echo(f"tpuops {version('tpuops')}{f'+g{commit[:7]}' if commit else ''}")
        raise typer.Exit(0)


def checkout_commit(root: Path) -> str | None:
    """The commit checked out at `root` when tpuops runs from a git checkout (an editable install), read from
    the files git keeps (a worktree's `.git` file, its `commondir`, loose or packed refs); None for a wheel's
    install or anything unreadable. No git process: `--version` stays instant."""
    try:
        if not (root / "pyproject.toml").is_file() or not (root / "tpuops").is_dir():
            return None
        gitdir = root / ".git"
        if gitdir.is_file():  # a worktree: `gitdir: PATH`
            gitdir = (root / gitdir.read_text().split(":", 1)[1].strip()).resolve()
        common = (
            gitdir / (gitdir / "commondir").read_text().strip()
            if (gitdir / "commondir").is_file()
            else gitdir
        )
        head = (gitdir / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head if len(head) == 40 else None
        ref = head.removeprefix("ref: ")
        for folder in (gitdir, common):
            if (folder / ref).is_file():
                return (folder / ref).read_text().strip()
        packed = common / "packed-refs"
        for line in packed.read_text().splitlines() if packed.is_file() else []:
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha
    except (OSError, IndexError):
        return None
    return None


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="Routine confirmations too (e.g. `tpuops -v logs RUN_ID`: a key already in the VM's ssh-keys).",
    ),
    config_file: str | None = typer.Option(
        None,
        "--config",
        metavar="PATH",
        help="The project's tpuops.toml to use (instead of the nearest one from here up to the repository's "
        "root); also the way to trust a file another user owns or can write.",
    ),
) -> None:
    """Run TPU-VM procedures (SOPs) on every worker: git-sync, clear the TPU lock, sync .env, run, follow."""
    if verbose:
        from tpuops import console

        console.verbose(True)
    if config_file is not None:  # read by tpuops.config.project_file, in this process and the ones it starts
        os.environ["TPUOPS_CONFIG"] = str(Path(config_file).expanduser().absolute())


app.add_typer(sop.app, name="sop", short_help="List, show and run SOP files.")
runs.register(app)
app.add_typer(runs.bench_app, name="bench", short_help="Benchmarks run through SOPs.")
app.add_typer(vm.app, name="vm", short_help="Find, describe, create, delete and wait for TPU VMs.")
app.add_typer(emulator.app, name="emulator", short_help="A local TPU API emulator to rehearse against.")
app.command("report", short_help="Steps, step times, compiles and failures of a log.")(report)
app.command("fit", short_help="Will a trainer config fit its TPU? (compiles it here)")(fit)
app.command("profile", short_help="A JAX profile of a running job: top ops, busy vs idle, the trace.")(
    profile
)


def _click_exceptions() -> tuple[tuple[type[BaseException], ...], ...]:
    """(Exit, usage errors, Abort) classes of click, of typer, and of the copy of click's exceptions newer
    typer versions bundle (typer._click): the top-level handler must catch whichever the installed one raises.
    click itself only when something imported it (an older typer does): importing it costs ~60 ms of start-up."""
    modules: list[object] = [typer]
    try:
        from typer._click import exceptions as bundled

        modules.append(bundled)
    except ImportError:
        import click  # noqa: F401 - typer < 0.20 is built on click itself: its exceptions below

    if "click" in sys.modules:
        modules.append(sys.modules["click"].exceptions)
    names = (("Exit",), ("ClickException",), ("Abort",))
    return tuple(tuple(getattr(m, n) for m in modules for n in group if hasattr(m, n)) for group in names)


def _usage_line(e: BaseException) -> str:
    """A click usage error as one line: what is wrong, then where the valid options are listed."""
    ctx = getattr(e, "ctx", None)
    where = f"{ctx.command_path} --help" if ctx is not None else "tpuops --help"
    message = e.format_message() if hasattr(e, "format_message") else str(e)
    return f"{' '.join(message.split())} (see {where})"


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM ends tpuops with exit 143: as an exception (`finally:` blocks close connections and tunnels),
    and for certain within 5 s (a worker thread still waiting on a remote command must not hold the exit)."""
    import threading

    from tpuops.errors import ExitCode

    code = int(ExitCode.TERMINATED)
    deadline = threading.Timer(5.0, os._exit, (code,))
    deadline.daemon = True  # an exit that finishes sooner does not wait for it
    deadline.start()
    raise SystemExit(code)


def main() -> None:
    """Entry point: one actionable line per error and a fixed exit code; tracebacks only with TPUOPS_DEBUG=1."""
    import signal

    from tpuops.errors import ExitCode, TpuopsError

    signal.signal(signal.SIGTERM, _terminated)
    exits, click_errors, aborts = _click_exceptions()
    try:
        # Without standalone mode click returns a command's typer.Exit code instead of exiting.
        # prog_name: usage lines and shell completion (`_TPUOPS_COMPLETE`) name the program as users type it,
        # however it was started (`python -m tpuops` too).
        code = app(standalone_mode=False, prog_name="tpuops")
    except TpuopsError as e:
        if os.environ.get("TPUOPS_DEBUG") == "1":
            raise
        from tpuops import console

        console.error(e.line(), int(e.exit_code), e.kind)
        sys.exit(int(e.exit_code))
    except exits as e:  # click's or typer's Exit: both carry exit_code
        sys.exit(getattr(e, "exit_code", 0))
    except click_errors as e:
        if os.environ.get("TPUOPS_DEBUG") == "1":
            raise
        if type(e).__name__ == "NoArgsIsHelpError":  # `tpuops vm` alone: the help is the answer
            getattr(e, "show")()  # noqa: B009 - one of several classes named alike, all with show()
            sys.exit(int(ExitCode.USAGE))
        usage = int(getattr(e, "exit_code", 2)) == 2
        code = int(ExitCode.USAGE) if usage else int(getattr(e, "exit_code", 1))
        from tpuops import console

        if "--json" in sys.argv[1:]:  # a usage error comes before any command ran, so before --json was seen
            console.json_mode(True)
        console.error(_usage_line(e), code, "usage")
        sys.exit(code)
    except aborts:
        sys.exit(int(ExitCode.FAILED))
    except KeyboardInterrupt:
        sys.exit(int(ExitCode.INTERRUPTED))
    sys.exit(code if isinstance(code, int) else 0)
