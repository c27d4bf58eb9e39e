"""`tpuops fit CONFIG`: will this trainer config fit its TPU? (an ahead-of-time compile on this machine)"""

from __future__ import annotations

from typing import Annotated

import typer

from tpuops.cli import options as o


@o.wired
def fit(
    config: Annotated[
        str, typer.Argument(help="Trainer config: a preset name (trainer/configs) or a YAML path.")
    ],
    set_: o.SetOpt = None,
    accelerator: o.AcceleratorOpt = None,
    topology: Annotated[
        str | None, typer.Option("--topology", help="JAX topology instead, e.g. v6e:2x4.")
    ] = None,
    slices: Annotated[
        int,
        typer.Option(
            "--slices",
            metavar="N",
            help="Compile for N slices joined over DCN (a multislice): DCN bytes and time per step reported too.",
        ),
    ] = 1,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Compile again even when a verdict is cached.")
    ] = False,
    region: Annotated[
        str | None,
        typer.Option(
            "--region",
            metavar="REGION",
            help="Region (or zone) the cost is priced in (default: the zone in tpuops.toml, else us-central1).",
            callback=o.checked("region", "--region"),
        ),
    ] = None,
    api_endpoint: Annotated[
        str | None,
        typer.Option(
            "--billing-endpoint",
            metavar="URL",
            envvar="TPUOPS_BILLING_API",
            help="Cloud Billing Catalog endpoint (e.g. the local emulator); default: Google's, when credentials allow.",
        ),
    ] = None,
    efficiency: Annotated[
        str,
        typer.Option(
            "--efficiency",
            metavar="BASIS",
            help="measured: the expected step (and the cost) at this trainer's efficiency measured on accelerators "
            "(bench/results/); published: at published efficiencies.",
        ),
    ] = "measured",
    json: o.JsonOpt = False,
) -> None:
    """Compile every program of a training step for a TPU, on this machine (no TPU needed), and judge it.

    Per phase (rollout: decode_cast, prefill, decode; update): per-device bytes against HBM, FLOPs, HBM bytes,
    collectives and the step time (a bound: every op at its roofline, collectives over their ICI links with 1 us
    per hop, the host's work; an expected range at this trainer's measured efficiency, beside the one at
    published efficiencies), and what a step and the run cost (on demand and Spot, priced by the Cloud Billing
    Catalog when credentials allow, else by the table shipped with tpuops, from SkyPilot's public catalog).
    Exit 0 when every phase keeps >= 10% of HBM free, 12 when not (with the cheapest override that fits).
    Needs jax with libtpu: pip install 'tpuops[tpu]'.

    \b
    Examples:
      tpuops fit qwen2.5-3b-v6e-8
      tpuops fit qwen2.5-3b-v6e-8-seed --json
      tpuops fit qwen2.5-3b-v6e-8 --accelerator v5e-8 --set train.micro_batch=16 --json
      tpuops fit qwen2.5-3b-v6e-8 --region europe-west4
      tpuops fit qwen2.5-7b-v6e-16 --slices 2 --json
    """
    from tpuops.checks import fit as fitlib
    from tpuops.config import parse_sets
    from tpuops.errors import UsageError
    from tpuops.run import fitview

    if efficiency not in ("measured", "published"):
        raise UsageError(f"--efficiency is measured or published, received {efficiency!r}")
    sets = [f"{k}={v}" for k, v in parse_sets(set_).items()]
    result = _compiled(config, sets, accelerator, topology, not no_cache, slices, json)
    result = _priced(result, efficiency, region, api_endpoint)
    fitview.fit_report(result, json)
    raise typer.Exit(fitlib.exit_code(result))


def _compiled(
    config: str, sets: list[str], accelerator: str | None, topology: str | None, use_cache: bool, slices: int,
    json: bool,
) -> dict[str, object]:  # fmt: skip
    """The config compiled for its TPU; at a terminal a status line says which program compiles and for how
    long (minutes for a big model)."""
    from tpuops import console
    from tpuops.checks import fit as fitlib

    watch = fitlib.FitProgress(config) if console.live_wanted(json) else None
    with console.Live(watch):
        return fitlib.check(
            config, sets, accelerator=accelerator, topology=topology, use_cache=use_cache, slices=slices,
            on_progress=watch.feed if watch is not None else None,
        )  # fmt: skip


def _priced(
    result: dict[str, object], efficiency: str, region: str | None, api_endpoint: str | None
) -> dict[str, object]:
    """The verdict with its expected step at the chosen efficiency, and its cost in the region (the user's zone
    in tpuops.toml when not given)."""
    from tpuops.checks import calibrate
    from tpuops.checks import fit as fitlib

    if region is None:
        from tpuops.config import load as load_user_config

        region = load_user_config().zone
    return fitlib.with_cost(calibrate.calibrate(result, efficiency), region, api_endpoint)
