"""`tpuops profile RUN_ID`: a JAX profile of a running job, summarised, kept in the run folder."""

from __future__ import annotations

from typing import Annotated

import typer

from tpuops.cli import options as o
from tpuops.cli.state import finish_json

RunIdArg = Annotated[str, typer.Argument(help="A running run's id (tpuops runs).")]


@o.wired
def profile(
    run_id: RunIdArg,
    *,
    seconds: Annotated[
        float, typer.Option("--seconds", min=0.1, max=600, help="How long to capture, in seconds.")
    ] = 3.0,
    worker: Annotated[
        str, typer.Option("--worker", metavar="K|all", help="The workers to capture: all, 0, or 0,2.")
    ] = "0",
    steps: Annotated[
        str | None,
        typer.Option(
            "--steps",
            metavar="A-B",
            help="Summarise only these steps (the job's step annotations in the capture); see also "
            "`tpuops run ... --profile-steps A-B`.",
        ),
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, max=100, help="How many ops the summary lists.")] = 10,
    json: o.JsonOpt = False,
) -> None:
    """Capture a JAX profile of a running job from its workers' profiler servers (exit 0; 1 when a capture
    failed: no server, port closed, worker unreachable; the job goes on untouched either way). Each trace lands
    in the run folder (profile/<time>/w<k>/) with a summary: the top ops by device time with their share, busy
    vs idle, steps and phases; and the commands that open it in Perfetto or XProf.

    \b
    Examples:
      tpuops profile 20261129-120000-grpo --seconds 3
      tpuops profile 20261129-120000-grpo --worker all --json
    """
    from tpuops.errors import UsageError
    from tpuops.logs.trace import parse_steps
    from tpuops.run import profile as library
    from tpuops.run import profileview

    finish_json(json)
    try:
        chosen = parse_steps(steps) if steps is not None else None
    except ValueError as e:
        raise UsageError(f"--steps: {e}") from None
    result = library.profile(run_id, seconds=seconds, worker=worker, steps=chosen)
    profileview.render(result, json, top)
    raise typer.Exit(result.code)
