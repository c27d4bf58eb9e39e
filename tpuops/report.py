"""The only module that prints: rich tables for people (stderr), JSON for machines (stdout)."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from tpuops.sop.actions import render_plan

out = Console(file=sys.stdout, highlight=False, soft_wrap=True)
err = Console(file=sys.stderr, highlight=False, soft_wrap=True)

_STYLE = {"changed": "green", "ok": "green", "nothing": "dim", "failed": "bold red", "busy": "bold yellow",
          "timeout": "bold red", "cancelled": "yellow", "skipped": "dim"}


def line(worker: int, text: str) -> None:
    """One live log line, prefixed with its worker."""
    err.print(f"[cyan]\\[w{worker}][/cyan] {_escape(text)}")


def step_done(step: Any) -> None:  # noqa: ANN401 - StepReport, imported lazily by callers
    bad = step.failed
    mark = "[red]✗[/red]" if bad else "[green]✓[/green]"
    summary = ", ".join(sorted({o.status for o in step.outcomes.values()}))
    err.print(f"{mark} {step.title} ({summary}, {step.duration_s:.2f}s)")


def sop_report(report: Any, code: int, as_json: bool) -> None:  # noqa: ANN401
    if as_json:
        out.print_json(json.dumps(sop_report_dict(report, code)))
        return
    table = Table(title=f"{report.sop}  run {report.run_id}  ({report.transport})", title_justify="left")
    table.add_column("step")
    for w in report.workers:
        table.add_column(f"w{w}")
    for s in report.steps:
        cells = []
        for w in report.workers:
            o = s.outcomes.get(w)
            cells.append("" if o is None else f"[{_STYLE.get(o.status, '')}]{o.status}[/] {_escape(o.detail)}")
        table.add_row(s.title, *cells)
    err.print(table)
    failure = report.first_failure()
    if failure:
        step, worker, outcome = failure
        err.print(f"[bold red]failed[/]: step {step.title} on w{worker}: {_escape(outcome.detail)}")
    err.print(f"done in {report.duration_s:.2f}s, exit code {code}")


def sop_report_dict(report: Any, code: int) -> dict[str, Any]:  # noqa: ANN401
    failure = report.first_failure()
    return {
        "sop": report.sop,
        "run_id": report.run_id,
        "transport": report.transport,
        "ok": report.ok,
        "exit_code": code,
        "failure": None
        if failure is None
        else {"step": failure[0].title, "worker": failure[1], "status": failure[2].status, "detail": failure[2].detail},
        "duration_s": round(report.duration_s, 3),
        "steps": [
            {
                "title": s.title,
                "kind": s.kind,
                "duration_s": round(s.duration_s, 3),
                "workers": {
                    str(w): {"status": o.status, "detail": o.detail, **o.data} for w, o in sorted(s.outcomes.items())
                },
            }
            for s in report.steps
        ],
    }


def dry_run(dr: Any, as_json: bool) -> None:  # noqa: ANN401
    if as_json:
        data = {
            "sop": dr.sop,
            "transport": dr.transport,
            "workers": dr.workers,
            "values": dr.values,
            "plan": [
                {"step": title, "workers": {str(w): [a.render() for a in acts] for w, acts in per.items()}}
                for title, per in dr.plan
            ],
        }
        out.print_json(json.dumps(data, default=str))
        return
    err.print(f"[bold]plan for {dr.sop}[/] on {dr.transport} workers {dr.workers} (nothing was run)")
    out.out(render_plan(dr.plan), end="", highlight=False)


def sop_list(rows: list[tuple[str, str, str]], as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps([{"name": n, "description": d, "path": p} for n, d, p in rows]))
        return
    table = Table("SOP", "description", "file")
    for n, d, p in rows:
        table.add_row(n, d, p)
    out.print(table)


def sop_show(sop: Any, path: str, as_json: bool) -> None:  # noqa: ANN401
    if as_json:
        out.print_json(json.dumps({"path": path, **sop.model_dump()}, default=str))
        return
    out.print(f"[bold]{sop.name}[/]  ({path})\n{sop.description}\n")
    params = Table("parameter", "type", "default", "description", title="parameters", title_justify="left")
    for name, p in sop.params.items():
        params.add_row(name, p.type, "(required)" if p.default is None else str(p.default), p.description)
    out.print(params)
    steps = Table("#", "step", "kind", title="steps", title_justify="left")
    for i, s in enumerate(sop.steps):
        steps.add_row(str(i), s.title, s.kind)
    out.print(steps)


def error(message: str, code: int, as_json: bool, kind: str) -> None:
    if as_json:
        out.print_json(json.dumps({"ok": False, "exit_code": code, "error": kind, "message": message}))
    err.print(f"[bold red]error[/]: {_escape(message)}")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
