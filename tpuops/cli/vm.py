"""`tpuops vm list|describe|create|delete|wait|clean`: TPU VMs through the Cloud TPU API or Compute Engine, and
the repositories' homes on their workers (clean)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from tpuops.cli import complete
from tpuops.cli import options as o
from tpuops.cli.command import App

if TYPE_CHECKING:  # named for the type checker (imported at use: the CLI starts fast)
    from tpuops.cloud.autostop import Autostop
    from tpuops.cloud.vms import ApiTarget

app = App(
    help="Find, describe, create, delete and wait for TPU VMs; clean their workers' homes.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

ZonesOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--zone",
        help="Zone (repeatable); all zones when omitted.",
        autocompletion=complete.zones,
        callback=o.checked_each("zone", "--zone"),
    ),
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", min=1, help="Seconds before the wait gives up.")]
AutostopActionOpt = Annotated[
    str,
    typer.Option(
        "--autostop-action",
        metavar="stop|delete",
        help="What autostop does to the idle VM: stop it, or delete it.",
    ),
]


def _target(project: str | None, api_endpoint: str | None, zone: str | None = None) -> ApiTarget:
    from tpuops.cloud.vms import ApiTarget

    return ApiTarget(project=project, api_endpoint=api_endpoint, zone=zone)


@app.command("list")
@o.wired
def list_(
    zone: ZonesOpt = None,
    project: o.ProjectOpt = None,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """List TPU VMs; without --zone every TPU zone is searched in parallel."""
    from tpuops import console
    from tpuops.cloud import vms
    from tpuops.run import vmview

    found, zones = vms.list_(_target(project, api_endpoint), zone or [], console.note)
    complete.remember_vms(found, zones)  # the names TAB offers (never an API call on TAB)
    vmview.vm_list(found, zones, json)


@app.command("describe")
@o.wired
def describe(
    name: o.VmNameArg,
    *,
    zone: o.ZoneOpt = None,
    project: o.ProjectOpt = None,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """Which API (tpu or compute), state, health, type, runtime or image, spot, and each worker's IPs."""
    from tpuops import console
    from tpuops.cloud import vms
    from tpuops.run import vmview

    vm, autostop = vms.describe(_target(project, api_endpoint, zone), name, console.note)
    vmview.vm_describe(vm, json, autostop=autostop)


@app.command("create")
@o.wired
def create(
    name: o.VmNameArg,
    *,
    type_: Annotated[
        str,
        typer.Option(
            "--accelerator",
            "--accelerator-type",
            "--type",
            metavar="TYPE",
            help="Accelerator type: v4-8, v5litepod-16, v6e-8, tpu7x-8, tpu7x-16, ... (--type: the older name).",
            autocompletion=complete.accelerator_types,
        ),
    ],
    runtime_version: Annotated[
        str | None,
        typer.Option("--runtime-version", help="Cloud TPU API software version, e.g. v2-alpha-tpuv6e."),
    ] = None,
    api: Annotated[
        str | None,
        typer.Option(
            "--api",
            help="tpu (Cloud TPU API) or compute (Compute Engine instance / MIG); default: api in tpuops.toml, "
            "else tpu; TPU7x is always compute.",
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option("--image", help="Compute Engine boot image, e.g. projects/P/global/images/family/F."),
    ] = None,
    zone: ZonesOpt = None,
    spot: Annotated[bool, typer.Option("--spot", help="Spot capacity (cheaper, preemptible).")] = False,
    queued: Annotated[bool, typer.Option("--queued", help="Through the queued-resources API.")] = False,
    slices: Annotated[
        int,
        typer.Option(
            "--slices",
            metavar="N",
            help="A multislice: N slices of TYPE joined over DCN (one queued resource; nodes NAME-0..NAME-N-1).",
        ),
    ] = 1,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait until READY (queued: ACTIVE then READY).")
    ] = False,
    timeout: TimeoutOpt = 1800.0,
    ssh_public_key: Annotated[
        str | None, typer.Option("--ssh-public-key", help="Public key for the VM's ssh-keys metadata.")
    ] = None,
    user: o.UserOpt = None,
    autostop: Annotated[
        str | None,
        typer.Option(
            "--autostop",
            metavar="DURATION",
            help="Stop the VM after it has been idle this long (no run holds it, no job runs): 30m, 2h, 3600. "
            "Off by default. Waits until READY and starts the watcher on w0 over SSH.",
        ),
    ] = None,
    autostop_action: AutostopActionOpt = "stop",
    identity: o.IdentityOpt = None,
    internal_ips: Annotated[
        bool, typer.Option("--internal-ips", help="No external IPs (reach it with IAP or from the VPC).")
    ] = False,
    project: o.ProjectOpt = None,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """Create a TPU VM. Several --zone are tried in turn when a zone has no capacity. Compute Engine: one
    instance for a single host, an instance template + workload policy + MIG for a multi-host slice.

    Examples:
      tpuops vm create mllm-jax-v6e-8 --accelerator v6e-8 --zone us-east1-d --runtime-version v2-alpha-tpuv6e --wait
      tpuops vm create ironwood --accelerator tpu7x-16 --zone us-central1-c --spot --wait
      tpuops vm create ms --accelerator v6e-8 --slices 2 --zone us-east5-b --runtime-version v2-alpha-tpuv6e --wait
    """
    from tpuops import console
    from tpuops.cloud import autostop as auto
    from tpuops.cloud import vms
    from tpuops.run import vmview

    setting = auto.parse(autostop, autostop_action) if autostop else None
    vm = vms.create(
        _target(project, api_endpoint),
        name,
        accelerator_type=type_,
        runtime_version=runtime_version,
        zones=zone or [],
        spot=spot,
        queued=queued,
        wait=wait,
        timeout=timeout,
        ssh_public_key=ssh_public_key,
        user=user,
        notify=console.note,
        internal_ips=internal_ips,
        api_name=api,
        image=image,
        slices=slices,
        autostop=setting,
    )
    complete.remember_vms([vm])
    watch = (
        None
        if setting is None
        else _autostop_watcher(vm.zone, name, setting, project, user, identity, api_endpoint)
    )
    vmview.vm_describe(vm, json, verb="created", autostop=watch)


def _autostop_watcher(
    zone: str, name: str, setting: Autostop, project: str | None, user: str | None, identity: str | None,
    api_endpoint: str | None,
) -> dict[str, str]:  # fmt: skip
    """The new VM's autostop watcher started on w0, over SSH (run/autostop.py): what vm describe shows of it."""
    from pathlib import Path

    from tpuops.config import target_from_options
    from tpuops.run import autostop as running

    spec = target_from_options(vm=name, zone=zone, project=project, user=user, identity=identity,
                               api_endpoint=api_endpoint)  # fmt: skip
    applied = running.apply(spec, setting, cwd=Path.cwd())
    return {"setting": setting.value, "words": setting.words, "watcher": applied.watcher,
            "status": f"watcher on w0: {applied.watcher}"}  # fmt: skip


@app.command("autostop")
@o.wired
def autostop(
    name: o.VmNameArg,
    duration: Annotated[
        str,
        typer.Argument(metavar="DURATION|off", help="Idle time before the VM stops (30m, 2h, 3600), or off."),
    ],
    *,
    action: AutostopActionOpt = "stop",
    zone: o.ZoneOpt = None,
    project: o.ProjectOpt = None,
    user: o.UserOpt = None,
    identity: o.IdentityOpt = None,
    internal_ip: o.InternalIpOpt = None,
    tunnel_through_iap: o.TunnelOpt = None,
    key_push: o.KeyPushOpt = None,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """Set, change or turn off the VM's autostop: a watcher on w0 stops (or with --autostop-action delete,
    deletes) the VM once no run has held it for DURATION. The setting is kept in the VM's metadata; each run's
    start starts the watcher again. `tpuops vm describe NAME` shows when it will act.

    \b
    Examples:
      tpuops vm autostop mllm-jax-v6e-8 30m
      tpuops vm autostop mllm-jax-v6e-8 2h --autostop-action delete
      tpuops vm autostop mllm-jax-v6e-8 off
    """
    from pathlib import Path

    from tpuops.cloud import autostop as auto
    from tpuops.config import target_from_options
    from tpuops.run import autostop as running
    from tpuops.run import vmview

    setting = auto.parse(duration, action)
    spec = target_from_options(
        vm=name, zone=zone, project=project, user=user, identity=identity, internal_ip=internal_ip,
        tunnel_through_iap=tunnel_through_iap, key_push=key_push, api_endpoint=api_endpoint,
    )  # fmt: skip
    vmview.autostop_set(running.apply(spec, setting, cwd=Path.cwd()), json)


@app.command("delete")
@o.wired
def delete(
    name: o.VmNameArg,
    *,
    zone: o.ZoneOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    timeout: TimeoutOpt = 900.0,
    project: o.ProjectOpt = None,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """Delete a TPU VM (its queued resource, if it came from one; a MIG with its template and workload policy)."""
    from tpuops import console
    from tpuops.cloud import vms
    from tpuops.errors import UsageError
    from tpuops.run import vmview

    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"deleting {name} needs confirmation", hint="pass --yes")
        typer.confirm(f"delete TPU VM {name}?", abort=True)
    vm = vms.delete(_target(project, api_endpoint, zone), name, timeout, console.note)
    complete.remember_vms([], forget=[vm.name])
    vmview.vm_deleted(vm.name, vm.zone, json)


@app.command("wait")
@o.wired
def wait(
    name: o.VmNameArg,
    *,
    state: Annotated[str, typer.Option("--state", help="READY, STOPPED, ... or DELETED (gone).")] = "READY",
    timeout: TimeoutOpt = 1800.0,
    zone: o.ZoneOpt = None,
    project: o.ProjectOpt = None,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """Wait until the VM reaches a state; exits 5 on timeout and 8 if it was preempted."""
    from tpuops import console
    from tpuops.cloud import vms
    from tpuops.run import vmview

    vm, where = vms.wait(_target(project, api_endpoint, zone), name, state, timeout, console.note)
    if vm is None:
        vmview.vm_gone(name, where, json)
    else:
        vmview.vm_describe(vm, json, verb="waited")


@app.command("clean")
@o.wired
def clean(
    name: o.VmNameArg,
    *,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="AGE",
            help="Only homes unused this long (3600, 30m, 12h, 7d): their checkout's last sync.",
        ),
    ] = None,
    zone: o.ZoneOpt = None,
    project: o.ProjectOpt = None,
    user: o.UserOpt = None,
    identity: o.IdentityOpt = None,
    internal_ip: o.InternalIpOpt = None,
    tunnel_through_iap: o.TunnelOpt = None,
    key_push: o.KeyPushOpt = None,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """Remove each repository's home (~/tpuops/<name>-<hash>/: its checkout and venv) on every worker, except
    those in use: none while a run holds the VM's run lock (the clean holds it itself meanwhile), nor one a
    process works in. `tpuops doctor --vm NAME` lists them first.

    Examples:
      tpuops vm clean mllm-jax-v6e-8 --older-than 7d
    """
    from pathlib import Path

    from tpuops.config import parse_duration, target_from_options
    from tpuops.run import health, homesview

    spec = target_from_options(
        vm=name, zone=zone, project=project, user=user, identity=identity, internal_ip=internal_ip,
        tunnel_through_iap=tunnel_through_iap, key_push=key_push, api_endpoint=api_endpoint,
    )  # fmt: skip
    age = int(parse_duration("--older-than", older_than)) if older_than else None
    homesview.cleaned(health.clean(spec, older_than_s=age, cwd=Path.cwd()), json)
