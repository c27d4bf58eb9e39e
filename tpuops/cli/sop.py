"""`tpuops sop list|show|run`: SOP files as commands."""

from __future__ import annotations

import typer

from tpuops.cli import options as o
from tpuops.cli.state import finish_json

app = typer.Typer(
    help="List, show and run SOPs (procedures as YAML files in sops/).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@app.command("list")
def list_(json: o.JsonOpt = False) -> None:
    """List the SOPs found in ./sops and the bundled sops/."""
    from tpuops import report
    from tpuops.sop import loader

    finish_json(json)
    report.sop_list(loader.list_sops(), json)


@app.command("show")
def show(name: str, json: o.JsonOpt = False) -> None:
    """Show a SOP's parameters and steps."""
    from tpuops import report
    from tpuops.sop import loader

    finish_json(json)
    path = loader.find(name)
    report.sop_show(loader.load(path), str(path), json)


@app.command("run")
def run(
    name: str,
    set_: o.SetOpt = None,
    worker: o.WorkerOpt = "all",
    dry_run: o.DryRunOpt = False,
    json: o.JsonOpt = False,
    force: o.ForceOpt = False,
    keep_going: o.KeepGoingOpt = False,
    parallel: o.ParallelOpt = None,
    vm: o.VmOpt = None,
    zone: o.ZoneOpt = None,
    project: o.ProjectOpt = None,
    host: o.HostOpt = None,
    hostkey: o.HostKeyOpt = None,
    user: o.UserOpt = None,
    identity: o.IdentityOpt = None,
    local: o.LocalOpt = False,
    local_workers: o.LocalWorkersOpt = 1,
    internal_ip: o.InternalIpOpt = False,
    api_endpoint: o.ApiEndpointOpt = None,
) -> None:
    """Run a SOP on every selected worker (in parallel), or print its plan with --dry-run.

    Examples:
      tpuops sop run sync --dry-run
      tpuops sop run sync --host me@10.0.0.2 --hostkey SHA256:... --set branch=main
      tpuops sop run smoke --vm mllm-jax-v6e-8 --zone us-east1-d --set steps=5 --json
    """
    from tpuops.cli.state import run_sop

    spec = o.target(
        vm=vm,
        zone=zone,
        project=project,
        host=host,
        hostkey=hostkey,
        user=user,
        identity=identity,
        local=local,
        local_workers=local_workers,
        internal_ip=internal_ip,
        api_endpoint=api_endpoint,
    )
    run_sop(
        name,
        o.parse_sets(set_),
        spec,
        worker=worker,
        dry_run=dry_run,
        json=json,
        force=force,
        keep_going=keep_going,
        parallel=parallel,
    )
