"""The command class of every tpuops command: values that are really options, `--set k v`, a SOP's own --help."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand

try:  # newer typer bundles its own copy of click, and its commands raise that copy's errors
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import UsageError  # type: ignore[assignment]

if TYPE_CHECKING:  # click as typer bundles it (the classes Command's methods receive)
    from typer._click.core import Context, Parameter
    from typer._click.formatting import HelpFormatter
    from typer.models import CommandFunctionType

HELP = ("-h", "--help")
SET_OPTS = ("--set", "-s")


def _option(p: Parameter) -> bool:
    return getattr(p, "param_type_name", "") == "option"


def _takes_value(p: Parameter) -> bool:
    return _option(p) and not getattr(p, "is_flag", False) and not getattr(p, "count", False)


def check_values(params: list[Parameter], args: list[str], ctx: Context | None = None) -> None:
    """Before click parses `args`: an option's value that is another option of the command (`--vm --zone Z`
    would take `--zone` as the VM's name), and a `--set` value without `=` (`--set steps 3`), are usage errors
    that say what to write instead (click would only call the next word an unexpected extra argument)."""
    takes: dict[str, Parameter] = {}
    names: set[str] = set(HELP)
    for p in params:
        if _option(p):
            names.update(p.opts, p.secondary_opts)
            if _takes_value(p):
                takes.update(dict.fromkeys(p.opts, p))
    i = 0
    while i < len(args) and args[i] != "--":
        opt = args[i]
        if opt not in takes or i + 1 >= len(args):
            i += 1
            continue
        value, after = args[i + 1], args[i + 2] if i + 2 < len(args) else None
        metavar = takes[opt].metavar or (takes[opt].name or "").upper()
        if value in names:
            raise UsageError(
                f"{opt} needs a value ({opt} {metavar}), but the next word is the option {value}", ctx
            )
        if opt in SET_OPTS and "=" not in value:
            fix = (
                f"--set {value}={after}"
                if after is not None and not after.startswith("-")
                else f"--set {value}=..."
            )
            raise UsageError(f"--set takes KEY=VALUE, got {value!r}: write {fix}", ctx)
        i += 2


def first_argument(params: list[Parameter], args: list[str]) -> str | None:
    """The first positional word of `args` (skipping options and their values): the SOP name of `run NAME`."""
    takes = {n for p in params if _takes_value(p) for n in p.opts}
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return args[i + 1] if i + 1 < len(args) else None
        if not a.startswith("-"):
            return a
        i += 2 if a in takes else 1
    return None


def _argument_type(nargs: int) -> Callable[[object], str | None]:
    """The help's type column for a positional argument: `...` when it takes several words, else nothing."""
    return lambda ctx: "..." if nargs != 1 else None


class Command(TyperCommand):
    """Every tpuops command: option values checked before click reads them (`check_values`); an option's value
    shown in gcloud's style in --help (`--zone ZONE`, not `--zone <str>`) where it names none itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # click's own parameters, passed on as given
        super().__init__(*args, **kwargs)
        for p in self.params:
            if (_takes_value(p) or p.param_type_name == "argument") and p.metavar is None:
                p.metavar = (p.name or "").strip("_").upper()
            if p.param_type_name == "argument":  # the metavar names it: no `<str>` / `<list[str]>` beside it
                setattr(p, "display_type_rich", _argument_type(p.nargs))  # noqa: B010 (a method, per instance)

    def get_short_help_str(self, limit: int = 45) -> str:
        """The line a group's --help lists: `short_help`, else the help's first sentence, whole (click would cut it
        at the column's width with `...`; the list wraps it instead)."""
        if self.short_help:
            return " ".join(self.short_help.split())
        words = " ".join((self.help or "").split("\n\n")[0].split())
        end = words.find(". ")
        return words if end < 0 else words[: end + 1]

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        if not any(a in HELP for a in args):
            check_values(self.get_params(ctx), args, ctx)
        return super().parse_args(ctx, args)


class SopCommand(Command):
    """A command that runs a SOP: its --help ends with the SOP's parameters (types, defaults, descriptions),
    as `tpuops sop show NAME` lists them. `sop` is the SOP it always runs; None: the one named on the line."""

    sop: str | None = None

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        ctx.meta["tpuops.sop"] = self.sop or first_argument(self.get_params(ctx), args)
        return super().parse_args(ctx, args)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        super().format_help(ctx, formatter)
        name = ctx.meta.get("tpuops.sop")
        if not name:
            with formatter.section("SOP parameters"):
                formatter.write_text(f"name a SOP to list its parameters: {ctx.command_path} grpo --help")
            return
        from tpuops.errors import TpuopsError
        from tpuops.sop import loader

        try:
            sop = loader.load(loader.find(name))
        except TpuopsError as e:
            with formatter.section(f"Parameters of SOP {name}"):
                formatter.write_text(e.line())
            return
        rows = [
            (f"{n} {p.type.upper()}", f"{p.description} [default: {p.shown_default}]".strip())
            for n, p in sop.params.items()
        ]
        with formatter.section(f"Parameters of SOP {sop.name} (--set NAME=VALUE)"):
            formatter.write_dl(rows)
            formatter.write_text(f"(tpuops sop show {sop.name}: its steps too)")


def sop_command(sop: str) -> type[SopCommand]:
    """The command class of a command that always runs SOP `sop` (recompile-check, gradcheck, ...)."""
    return type(f"SopCommand_{sop}", (SopCommand,), {"sop": sop})


class App(typer.Typer):
    """typer.Typer whose commands are `Command`s unless a command names its own class."""

    def command(
        self,
        name: str | None = None,
        *,
        cls: type[TyperCommand] | None = None,
        **kw: Any,  # typer's own
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(name, cls=cls or Command, **kw)
