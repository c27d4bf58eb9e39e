"""`tpuops emulator serve|fault|state`: the local TPU API emulator (real sshd per worker) and its faults."""

from __future__ import annotations

from typing import Annotated

import typer

from tpuops.cli import options as o
from tpuops.cli.command import App

app = App(
    help="A local TPU API emulator: rehearse SOPs against VMs backed by real sshd servers.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
fault = App(help="Inject a fault into a running emulator.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(fault, name="fault")

NodeArg = Annotated[str, typer.Argument(help="VM name, ZONE/NAME, or projects/.../nodes/NAME.")]


@app.command("serve")
@o.wired
def serve(
    *,
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1 (0: any free port).")] = 0,
    state_dir: Annotated[
        str | None, typer.Option("--state-dir", help="Host keys, sshd configs, client key.")
    ] = None,
    zone: Annotated[
        list[str] | None,
        typer.Option(
            "--zone", help="Zones it offers (repeatable).", callback=o.checked_each("zone", "--zone")
        ),
    ] = None,
    authorized_key: Annotated[
        str | None, typer.Option("--authorized-key", help="Public key file for VMs created without ssh-keys.")
    ] = None,
    create_delay: Annotated[float, typer.Option("--create-delay", help="Seconds a create takes.")] = 0.0,
    unavailable: Annotated[int, typer.Option("--unavailable", help="Answer 503 to the first N calls.")] = 0,
    no_capacity: Annotated[
        list[str] | None, typer.Option("--no-capacity", help="The first create in ZONE fails for capacity.")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="Log every request to stderr.")] = False,
) -> None:
    """Serve the TPU v2 REST API on loopback until Ctrl-C; prints the `export TPUOPS_TPU_API=...` line."""
    from pathlib import Path

    from tpuops import console
    from tpuops.cloud.emulator import control
    from tpuops.config import state_home
    from tpuops.run import vmview

    where = Path(state_dir) if state_dir else state_home() / "emulator"
    faults: dict[str, object] = {"unavailable": unavailable} if unavailable else {}
    if no_capacity:
        faults["capacity"] = {z: no_capacity.count(z) for z in no_capacity}

    def ready(url: str, identity: str, zones: list[str]) -> None:
        vmview.emulator_started(url, identity, zones, str(where))

    control.serve(
        where,
        port=port,
        zones=zone,
        authorized_key_file=authorized_key,
        create_delay=create_delay,
        faults=faults,
        verbose=verbose,
        on_ready=ready,
        on_stop=console.event,
    )


def _admin(api_endpoint: str | None, action: str, body: dict[str, object], json: bool) -> None:
    from tpuops.cloud.emulator import control
    from tpuops.run import vmview

    vmview.emulator_state(control.admin(api_endpoint, action, body), json)


@fault.command("preempt")
@o.wired
def preempt(
    node: NodeArg,
    worker: Annotated[
        int | None, typer.Option("--worker", help="Compute Engine MIG: only this worker's instance.")
    ] = None,
    notice: Annotated[
        float,
        typer.Option(
            "--notice",
            metavar="SECONDS",
            min=0,
            help="Announce it first: each worker's metadata says instance/preempted=TRUE this many seconds "
            "before the VM goes, as Compute Engine tells a Spot VM (0: no notice).",
        ),
    ] = 0.0,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """The VM becomes PREEMPTED (a Compute Engine instance TERMINATED) and its sshd servers stop; a MIG
    recreates its preempted instances soon after (new address and host key). With --notice the command returns
    at once and the preemption follows."""
    body: dict[str, object] = {"node": node, **({"worker": worker} if worker is not None else {})}
    _admin(api_endpoint, "preempt", {**body, **({"notice": notice} if notice else {})}, json)


@fault.command("recreate")
@o.wired
def recreate(
    node: Annotated[str, typer.Argument(help="Compute Engine MIG (or instance) name, or ZONE/NAME.")],
    worker: Annotated[int | None, typer.Option("--worker", help="Only this worker's instance.")] = None,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """A MIG recreates an instance at once: same name, new id, new address and host key."""
    _admin(
        api_endpoint, "recreate", {"node": node, **({"worker": worker} if worker is not None else {})}, json
    )


@fault.command("swap-host-key")
@o.wired
def swap_host_key(
    node: NodeArg,
    worker: Annotated[int, typer.Option("--worker", help="Worker index.")] = 0,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """The worker's sshd gets a new host key; guest attributes keep the old one (tpuops must refuse it)."""
    _admin(api_endpoint, "swap-host-key", {"node": node, "worker": worker}, json)


@fault.command("unavailable")
@o.wired
def unavailable(
    count: Annotated[int, typer.Argument(help="How many API calls fail.")],
    code: Annotated[int, typer.Option("--code", help="503 or 429.")] = 503,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """The next COUNT API calls answer 503 (or 429)."""
    _admin(api_endpoint, "faults", {"unavailable": count, "code": code}, json)


@fault.command("answer")
@o.wired
def answer(
    mode: Annotated[
        str,
        typer.Argument(
            help="html (a captive portal's page; with --code 502 a proxy's error page), truncated (JSON cut off "
            "half-way) or hang (no answer at all)."
        ),
    ],
    count: Annotated[int, typer.Argument(help="How many API calls are answered so.")] = 1,
    api: Annotated[str, typer.Option("--api", help="tpu, compute (Compute Engine) or all.")] = "all",
    code: Annotated[int, typer.Option("--code", help="The HTTP status an html page comes with.")] = 200,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """The next COUNT calls of the TPU API or Compute Engine get a broken answer (0: none)."""
    from tpuops.cloud.emulator.answers import APIS, MODES
    from tpuops.errors import UsageError

    if mode not in MODES or api not in (*APIS, "all"):
        raise UsageError(f"fault answer {mode} --api {api}: the mode is one of {', '.join(MODES)}, the api one "
                         f"of {', '.join(APIS)}, all")  # fmt: skip
    _admin(
        api_endpoint, "faults", {"answers": {"mode": mode, "count": count, "api": api, "code": code}}, json
    )


@fault.command("capacity")
@o.wired
def capacity(
    zone: Annotated[
        str, typer.Argument(help="Zone, or * for every zone.", callback=o.checked("zone", "ZONE", also="*"))
    ],
    count: Annotated[int, typer.Option("--count", help="How many creates fail.")] = 1,
    api_endpoint: o.ApiEndpointOpt = None,
    json: o.JsonOpt = False,
) -> None:
    """The next COUNT creates in ZONE fail for capacity (plain) or wait for resources (queued)."""
    _admin(api_endpoint, "faults", {"capacity": {zone: count}}, json)


@app.command("state")
@o.wired
def state(api_endpoint: o.ApiEndpointOpt = None, json: o.JsonOpt = False) -> None:
    """The emulator's VMs, queued resources and pending faults."""
    _admin(api_endpoint, "state", {}, json)
