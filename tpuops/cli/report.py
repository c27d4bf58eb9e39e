"""`tpuops report LOGFILE|RUN_ID`: steps, compiles, failures and evals of a log as a table, JSON or a page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tpuops.cli import options as o

TargetArg = Annotated[
    str,
    typer.Argument(help="A log file, a run directory, or a RUN_ID (the local copy in $TPUOPS_HOME/runs)."),
]
WarmupOpt = Annotated[
    int, typer.Option("--warmup", min=0, help="Steps at the start that may compile (excluded from dt stats).")
]
HtmlOpt = Annotated[
    Path | None, typer.Option("--html", help="Also write a self-contained HTML page with plots.")
]
BaselineOpt = Annotated[
    Path | None, typer.Option("--baseline", help="A saved `tpuops report --json` output to compare with.")
]
StepPatternOpt = Annotated[
    str | None,
    typer.Option(
        "--step-pattern",
        metavar="REGEX",
        help="Your step lines' regex, with a group (?P<step>...) and optionally (?P<dt>...) "
        "(default: step=N, step: N, Step N/M, [step N]).",
    ),
]
ColumnsOpt = Annotated[
    str | None,
    typer.Option(
        "--columns",
        metavar="A,B,C",
        help="The step lines' fields the steps table shows, in order (default: the first few the lines have; "
        "a run's own `--set columns=...`).",
    ),
]
ThresholdOpt = Annotated[
    float, typer.Option("--threshold", min=0.0, help="Relative change counted as a regression (0.1 = 10%).")
]


@o.wired
def report(
    target: TargetArg,
    *,
    warmup: WarmupOpt = 1,
    json: o.JsonOpt = False,
    html: HtmlOpt = None,
    baseline: BaselineOpt = None,
    threshold: ThresholdOpt = 0.1,
    step_pattern: StepPatternOpt = None,
    columns: ColumnsOpt = None,
) -> None:
    """Report a training log (exit 0 ok, 1 failures or a baseline regression, 7 recompiles after warm-up, 14 a
    run `tpuops stop` ended). A RUN_ID whose logs are not here yet is fetched from its workers first.

    \b
    Examples:
      tpuops report ~/.tpuops/runs/20260101-grpo/worker-0.log
      tpuops report 20260101-grpo --warmup 2 --html report.html
      tpuops report run.log --json --baseline baseline.json --threshold 0.05
      tpuops report train.log --columns loss,acc,dt --html report.html
    """
    from tpuops import console
    from tpuops.run import logreport, review

    r, hint = review.review(
        target, warmup, baseline, threshold, html, step_pattern, columns, notice=console.event
    )
    logreport.render(r.report, r.code, json, r.deltas, html, r.estimate)
    if hint:
        console.event(f"fix: {hint}")
    raise typer.Exit(r.code)
