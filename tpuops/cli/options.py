"""Shared CLI options: Annotated aliases, option groups declared once, and `wired`, which gives them to commands."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import typer

from tpuops.cli import complete
from tpuops.config import validators

if typing.TYPE_CHECKING:
    from tpuops.config import TargetSpec


def checked(kind: str, option: str, also: str = "") -> Callable[[str | None], str | None]:
    """A Typer callback: the name checked by the API's own rules before the command runs (else exit 2); `also`:
    one more value taken as it is (`*`: every zone)."""

    def check(value: str | None) -> str | None:
        return value if also and value == also else validators.name(kind, value, option)

    return check


def checked_each(kind: str, option: str) -> Callable[[list[str] | None], list[str] | None]:
    """`checked` for a repeatable option: every value by the API's own rules (else exit 2)."""

    def check(values: list[str] | None) -> list[str] | None:
        for value in values or []:
            validators.name(kind, value, option)
        return values

    return check


VmOpt = Annotated[
    str | None,
    typer.Option(
        "--vm",
        metavar="NAME",
        help="TPU VM name (found through the TPU API).",
        callback=checked("vm", "--vm"),
        autocompletion=complete.vm_names,
    ),
]
ZoneOpt = Annotated[
    str | None,
    typer.Option(
        "--zone",
        metavar="ZONE",
        help="Zone of the VM; searched when omitted.",
        callback=checked("zone", "--zone"),
        autocompletion=complete.zones,
    ),
]
VmNameArg = Annotated[
    str,
    typer.Argument(help="TPU VM name.", callback=checked("vm", "NAME"), autocompletion=complete.vm_names),
]
ProjectOpt = Annotated[
    str | None,
    typer.Option(
        "--project",
        metavar="PROJECT",
        help="Google Cloud project.",
        callback=checked("project", "--project"),
    ),
]
HostOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--host",
        metavar="USER@IP[:PORT]",
        help="Direct SSH target user@ip[:port], one per worker (repeatable).",
    ),
]
HostKeyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--hostkey",
        metavar="SHA256:KEY",
        help="Pinned host key SHA256:... per worker, in order (overrides a VM's own keys).",
    ),
]
UserOpt = Annotated[
    str | None, typer.Option("--user", metavar="USER", help="SSH user (default: from --host or config).")
]
IdentityOpt = Annotated[
    str | None, typer.Option("--identity", "-i", metavar="KEY_FILE", help="SSH private key file.")
]
LocalOpt = Annotated[
    bool, typer.Option("--local", help="Run on this machine (the default without --vm/--host).")
]
LocalWorkersOpt = Annotated[
    int,
    typer.Option(
        "--local-workers", metavar="N", min=1, help="Simulated workers for --local (scratch roots)."
    ),
]
WorkerOpt = Annotated[
    str, typer.Option("--worker", "-w", metavar="WORKERS", help="Workers to use: all, 0, or 0,2.")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", metavar="KEY=VALUE", help="Parameter override key=value (repeatable)."),
]
CommandArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="-- CMD ARGS",
        help="Your own command, after `--`: it reaches every worker word for word (shell-quoted), never read here.",
        show_default=False,
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Machine-readable report on stdout; people's output on stderr.")
]
RawOpt = Annotated[
    bool,
    typer.Option(
        "--raw",
        help="Workers' lines as they are, terminal control sequences included (shown escaped otherwise).",
    ),
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the plan, one line per step per worker (--verbose: every command in full); change nothing "
        "(no key pushed, no lock taken). It reads each worker (read-only) for the local edits a git sync would "
        "discard, unless --offline.",
    ),
]
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="Routine confirmations too (a key already in the VM's ssh-keys); with --dry-run: every command of "
        "the plan in full (the exact shell).",
    ),
]
OfflineOpt = Annotated[
    bool, typer.Option("--offline", help="With --dry-run: the plan only, never connect to a worker.")
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Stop processes holding the TPU before clearing its lock.")
]
KeepGoingOpt = Annotated[
    bool, typer.Option("--keep-going", help="Continue on the other workers after a failure.")
]
ParallelOpt = Annotated[
    int | None, typer.Option("--parallel", metavar="N", min=1, help="Workers handled at once (default 16).")
]
RecoverOpt = Annotated[
    bool,
    typer.Option("--recover", help="Watch the VM; on preemption recreate it and resume from the checkpoint."),
]
MaxRecoveriesOpt = Annotated[
    int, typer.Option("--max-recoveries", metavar="N", min=0, help="Recoveries before giving up.")
]
SkipFitOpt = Annotated[
    bool,
    typer.Option(
        "--skip-fit", help="On a VM, start without compiling the config for its TPU first (tpuops fit)."
    ),
]
UnreachableOpt = Annotated[
    float | None,
    typer.Option(
        "--unreachable-s",
        metavar="SECONDS",
        min=1.0,
        help="Seconds no worker of the VM answers on SSH before it counts as lost (default 300, or "
        "unreachable_s in tpuops.toml).",
        callback=lambda v: (
            None if v is None else validators.number(v, "--unreachable-s", minimum=1.0, above=False)
        ),
    ),
]
# The target's switches: None = not given, so either form overrides tpuops.toml (internal_ip, key_push, ...).
InternalIpOpt = Annotated[
    bool | None,
    typer.Option(
        "--internal-ip/--no-internal-ip",
        help="Connect to workers' internal IPs (default: internal_ip in tpuops.toml, else no).",
        show_default=False,
    ),
]
TunnelOpt = Annotated[
    bool | None,
    typer.Option(
        "--tunnel-through-iap/--no-tunnel-through-iap",
        help="Reach workers through IAP TCP tunnels (automatic without external IPs).",
        show_default=False,
    ),
]
KeyPushOpt = Annotated[
    bool | None,
    typer.Option(
        "--key-push/--no-key-push",
        help="May add your key to a VM's ssh-keys metadata (default: key_push in tpuops.toml, else yes).",
        show_default=False,
    ),
]
KeyTtlOpt = Annotated[
    str | None,
    typer.Option(
        "--key-ttl", metavar="DURATION", help="OS Login: the imported key expires after this (30m, 12h, 7d)."
    ),
]
AcceleratorOpt = Annotated[
    str | None,
    typer.Option(
        "--accelerator",
        "--accelerator-type",
        metavar="TYPE",
        help="TPU type, e.g. v6e-8 (default: the config's mesh.accelerator); as in `vm create`.",
        autocompletion=complete.accelerator_types,
    ),
]
RunIdArg = Annotated[
    str, typer.Argument(help="A run id (tpuops runs).", autocompletion=complete.run_ids, show_default=False)
]
SopNameArg = Annotated[
    str,
    typer.Argument(
        help="SOP name (tpuops sop list), e.g. grpo; `tpuops run grpo -h` lists its parameters.",
        autocompletion=complete.sop_names,
    ),
]
ProfileStepsOpt = Annotated[
    str | None,
    typer.Option(
        "--profile-steps",
        metavar="A-B",
        help="Trace steps A to B with JAX's profiler (the job itself: the bundled trainer does; your own program "
        "reads TPUOPS_PROFILE_STEPS, docs/performance.md); the end report and `tpuops report RUN_ID --html` show "
        "their top ops and phases.",
    ),
]
BenchProfileOpt = Annotated[
    bool,
    typer.Option(
        "--profile",
        help="Trace steps 2-3 of each variant (--set profile_steps=A-B for others; your own program: "
        "TPUOPS_PROFILE_STEPS) and show its top ops beside its times.",
    ),
]
ApiEndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--api-endpoint",
        metavar="URL",
        envvar="TPUOPS_TPU_API",
        help="TPU API endpoint (e.g. the local emulator).",
    ),
]


# Option groups: a command takes one as a parameter (`target: o.TargetOptions`) and `wired` spreads its fields into
# the command's options, so a new shared option is one field here. Field order is --help order.


@dataclass(frozen=True)
class RunOptions:
    """What every SOP command takes besides its target."""

    set_: SetOpt = None
    worker: WorkerOpt = "all"
    dry_run: DryRunOpt = False
    verbose: VerboseOpt = False
    offline: OfflineOpt = False
    json: JsonOpt = False
    force: ForceOpt = False
    keep_going: KeepGoingOpt = False
    parallel: ParallelOpt = None

    def sets(self) -> dict[str, str]:
        from tpuops.config import parse_sets  # tpuops.config imports pydantic: not at CLI start-up

        return parse_sets(self.set_)


@dataclass(frozen=True)
class TargetOptions:
    """Where to run: a VM through the TPU API, SSH hosts, or this machine."""

    vm: VmOpt = None
    zone: ZoneOpt = None
    project: ProjectOpt = None
    host: HostOpt = None
    hostkey: HostKeyOpt = None
    user: UserOpt = None
    identity: IdentityOpt = None
    local: LocalOpt = False
    local_workers: LocalWorkersOpt = 1
    internal_ip: InternalIpOpt = None
    api_endpoint: ApiEndpointOpt = None
    tunnel_through_iap: TunnelOpt = None
    key_push: KeyPushOpt = None
    key_ttl: KeyTtlOpt = None

    def spec(self) -> TargetSpec:
        from tpuops.config import target_from_options

        return target_from_options(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


@dataclass(frozen=True)
class WatchOptions:
    """How a run on a VM is watched: recovery, the fit preflight, when a silent VM counts as lost."""

    recover: RecoverOpt = False
    max_recoveries: MaxRecoveriesOpt = 3
    skip_fit: SkipFitOpt = False
    unreachable_s: UnreachableOpt = None

    def recoveries(self) -> int | None:
        """How many recreations are allowed; None without --recover."""
        return self.max_recoveries if self.recover else None


def wired(fn: Callable[..., None]) -> Callable[..., None]:
    """`fn` as Typer should see it: each option-group parameter spread into its fields (in place, same kind),
    and on a call the groups rebuilt and the command's --json recorded for the error handler (tpuops.console)."""
    hints = typing.get_type_hints(fn, include_extras=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, type] = {}
    for p in inspect.signature(fn).parameters.values():
        hint = hints.get(p.name, p.annotation)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            groups[p.name] = hint
            field_hints = typing.get_type_hints(hint, include_extras=True)
            params += [
                inspect.Parameter(f.name, p.kind, default=f.default, annotation=field_hints[f.name])
                for f in dataclasses.fields(hint)
            ]
        else:
            params.append(p.replace(annotation=hint))
    names = [p.name for p in params]
    assert len(names) == len(set(names)), f"{fn.__name__}: an option is declared twice: {names}"

    def command(**kwargs: object) -> None:
        from tpuops import console

        console.json_mode(bool(kwargs.get("json")))
        if kwargs.get("verbose"):
            console.verbose(True)
        for name, group in groups.items():
            kwargs[name] = group(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(group)})
        fn(**kwargs)

    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(command, attr, getattr(fn, attr))
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.wired = True  # type: ignore[attr-defined]
    return command
