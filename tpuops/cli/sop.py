"""`tpuops sop list|show|run`: SOP files as commands."""

from __future__ import annotations

import typer

from tpuops.cli import options as o
from tpuops.cli import runs
from tpuops.cli.command import App, SopCommand

app = App(
    help="List, show and run SOPs (procedures as YAML files in sops/).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@app.command("list")
@o.wired
def list_(json: o.JsonOpt = False) -> None:
    """List the SOPs found in ./sops and the bundled sops/."""
    from tpuops.run import report
    from tpuops.sop import loader

    rows, broken, code = loader.scan_sops()
    report.sop_list(rows, json, broken)  # broken files are listed with their errors
    raise typer.Exit(code)


@app.command("show")
@o.wired
def show(name: o.SopNameArg, json: o.JsonOpt = False) -> None:
    """Show a SOP's parameters and steps."""
    from tpuops.run import report
    from tpuops.sop import loader

    path = loader.find(name)
    report.sop_show(loader.load(path), str(path), json)


@app.command("new")
@o.wired
def new(name: str, cmd: o.CommandArg = None) -> None:
    """Write a commented starting SOP for your own command into sops/ (the nearest one, or sops_dir).

    \b
    Examples:
      tpuops sop new train -- python -u scripts/train.py --config configs/small.yaml
      tpuops run train --vm mllm-jax-v6e-8
    """
    from pathlib import Path

    from tpuops import console
    from tpuops.sop import new as library

    path, note = library.write(name, list(cmd or []), Path.cwd())
    console.event(f"wrote {path}: edit it, then `tpuops sop show {name}` and `tpuops run {name} --dry-run`")
    if note:
        console.event(note)


@app.command("run", cls=SopCommand)
@o.wired
def run(
    name: runs.SopNameArg,
    cmd: o.CommandArg = None,
    *,
    opts: o.RunOptions,
    target: o.TargetOptions,
    watch: o.WatchOptions,
) -> None:
    """Run a SOP on every selected worker (in parallel), or print its plan with --dry-run.

    \b
    Examples:
      tpuops sop run sync --dry-run
      tpuops sop run sync --host me@10.0.0.2 --hostkey SHA256:... --set branch=main
      tpuops sop run smoke --vm mllm-jax-v6e-8 --zone us-east1-d --set steps=5 --json
    """
    runs.run_named(name, {}, opts, target, watch, cmd)
