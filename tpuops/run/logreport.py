"""Rendering of a LogReport (report.py's sibling): rich tables on stderr, JSON on stdout (the HTML page:
htmlpage.py). The steps table shows the log's own fields (the first few, or the user's `columns`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuops import jsonout
from tpuops.console import Col, err, escape, grid, out, table_of
from tpuops.errors import ExitCode, UsageError, error_class
from tpuops.logs.events import LogReport
from tpuops.logs.fields import pick, value
from tpuops.run.baseline import Delta, compare
from tpuops.run.logtext import NOT_LOGGED, NOT_SEEN, cache_line, chip_lines, compiles_logged, exit_code

if TYPE_CHECKING:  # built by console.py's helpers
    from rich.table import Table

    from tpuops.run.estimate import Estimate

HEAD_ROWS = 10  # the terminal table shows the first and last steps; --json and --html have every kept row


@dataclass
class Reviewed:
    """`tpuops report`'s answer: the log's report, its comparison with a baseline, and the exit code."""

    report: LogReport
    deltas: list[Delta] | None
    code: int
    estimate: Estimate | None = None  # the run's fit estimate (result.json), for cost and HBM beside it


def review(
    target: str,
    warmup: int,
    baseline: Path | None,
    threshold: float,
    html: Path | None,
    step_pattern: str | None = None,
    columns: str | None = None,
) -> Reviewed:
    """Scan a log file, run directory or run id (with the user's step-line regex, when given); compare with a
    baseline; write the HTML page when asked. `columns`: the fields the steps table shows (a run's own
    `--set columns=...` otherwise); one its step lines never have is exit 2."""
    from tpuops.logs.fields import check_columns, parse_columns
    from tpuops.logs.lines import compile_step_pattern
    from tpuops.run import scan

    if step_pattern:
        compile_step_pattern(step_pattern)  # exit 2 naming it, before any file is read
    chosen = parse_columns(columns)
    report = scan.scan_target(target, warmup, step_pattern=step_pattern)
    if chosen:
        report.columns = chosen
    if columns is not None or report.steps:
        check_columns(report.fields, chosen)
    from tpuops.run.estimate import saved

    deltas = None if baseline is None else load_baseline(baseline, report, threshold)
    est = saved(target) if not Path(target).expanduser().is_file() else None
    if html is not None:
        from tpuops.run.htmlpage import profile_section, run_meta

        write_html(report, html, deltas, run_meta(target), est, profile_section(target))
    return Reviewed(report, deltas, exit_code(report, deltas), est)


def load_baseline(path: Path, report: LogReport, threshold: float) -> list[Delta]:
    """Compare with a saved `tpuops report --json` output (or a bare report dict)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        hint = "save one with `tpuops report LOG --json > FILE`"
        raise UsageError(f"cannot read baseline {path}: {e}", hint=hint) from None
    if not isinstance(data, dict):
        raise UsageError(f"baseline {path} is not a JSON object")
    return compare(report, data, threshold)


def as_dict(
    report: LogReport,
    code: int,
    deltas: list[Delta] | None,
    html: Path | None,
    estimate: Estimate | None = None,
) -> dict[str, object]:
    from tpuops.run.estimate import compare

    return {
        "ok": code == 0,
        "exit_code": code,
        "error_class": error_class(code),  # "stopped" for a run `tpuops stop` ended (run/finish.py)
        "report": report.to_dict(),
        "baseline": None if deltas is None else [d.__dict__ for d in deltas],
        "html": None if html is None else str(html),
        "against_fit": compare(estimate, report),
    }


def write_html(
    report: LogReport,
    path: Path,
    deltas: list[Delta] | None = None,
    meta: dict[str, str] | None = None,
    estimate: Estimate | None = None,
    profile: str | None = None,
) -> None:
    from tpuops.run.htmlpage import page

    Path(path).write_text(page(report, deltas, meta, estimate, profile))


def render(
    report: LogReport,
    code: int,
    as_json: bool,
    deltas: list[Delta] | None,
    html: Path | None,
    estimate: Estimate | None = None,
) -> None:
    if as_json:
        out.print_json(jsonout.dumps(as_dict(report, code, deltas, html, estimate)))
        return
    span = f" ({report.first_step}..{report.last_step})" if report.steps else ""
    err.print(
        f"[bold]{escape(report.source)}[/]  workers {report.workers}  {report.lines} lines  "
        f"{report.steps} steps{span}, warm-up {report.warmup}"
    )
    if report.rows:
        err.print(steps_table(report))
    for line in [*_progress(report), *_steady_and_compiles(report, code), *_notes(report)]:
        err.print(line)
    if report.chips:
        for line in chip_lines(report):
            err.print(escape(line), highlight=False)
    _against_fit(report, estimate)
    if report.failures:
        err.print(failures_table(report))
    if deltas:
        err.print(baseline_table(deltas))
    if html:
        err.print(f"wrote {html}")
    verdict = {
        0: "[green]ok[/]",
        7: "[bold yellow]recompiles after warm-up[/]",
        14: "[bold yellow]stopped[/]",
    }.get(code, "[bold red]failed[/]")
    err.print(f"{verdict} (exit code {code})")


def _progress(report: LogReport) -> list[str]:
    """How the mean reward moved from the first kept step to the last (a run's own first fields otherwise)."""
    first, last = (report.rows[0], report.rows[-1]) if report.rows else (None, None)
    if not first or not last or last is first:
        return []
    if first.reward_mean is not None and last.reward_mean is not None:
        change = last.reward_mean - first.reward_mean
        return [
            f"reward_mean {first.reward_mean:.4f} at step {first.step} -> {last.reward_mean:.4f} at step "
            f"{last.step} ({change:+.4f})"
        ]
    if "reward_mean" in report.fields:
        return []
    lines = []
    for name in [n for n in pick(report.fields, report.columns) if n != "dt"][:2]:  # a run's own terms
        a, b = value(first, name), value(last, name)
        if a is not None and b is not None:
            lines.append(f"{name} {a:.6g} at step {first.step} -> {b:.6g} at step {last.step}")
    return lines


def _steady_and_compiles(report: LogReport, code: int) -> list[str]:
    """The steady state's step time, and the compiles by window (or why they are not known)."""
    lines = []
    if report.dt:
        d = report.dt
        extra = "" if report.tokens_per_s_mean is None else f"  tokens/s mean {report.tokens_per_s_mean:.1f}"
        lines.append(
            f"steady dt over {d.n} steps: mean {d.mean:.3f}s  p50 {d.p50:.3f}s  p90 {d.p90:.3f}s{extra}"
        )
    c = report.compiles
    if not compiles_logged(report):  # a recompile check (exit 13) is not told to run a recompile check
        lines.append(f"compiles: {NOT_SEEN if code == ExitCode.UNVERIFIED else NOT_LOGGED}")
    else:
        lines.append(
            f"compiles: {c.get('total', 0)} total, {c.get('warmup', 0)} in warm-up, {c.get('eval', 0)} in "
            f"eval, {c.get('after_warmup', 0)} after warm-up, {c.get('open', 0)} after the last step"
        )
    if cached := cache_line(report):
        lines.append(escape(cached))
    for comp in report.recompiles:
        lines.append(
            f"[bold yellow]recompile[/] at step {comp.step} (w{comp.worker}): {escape(comp.function)}"
        )
        if comp.explanation:
            lines.append(f"[dim]{escape(comp.explanation)}[/]")
    return lines


def _notes(report: LogReport) -> list[str]:
    """What else the log said: evals, W&B, checkpoints, reward function errors, the summary, metrics lines."""
    lines = ["eval " + " ".join(f"{k}={v}" for k, v in e.items()) for e in report.evals]
    if report.wandb_url or report.wandb:
        lines.append(f"W&B: {escape(report.wandb_url or report.wandb or '')}")
    if report.checkpoints:
        lines.append(f"checkpoints: {report.checkpoints}, last {escape(report.last_checkpoint or '?')}")
    if report.reward_errors:
        lines.append(
            "reward function errors: " + ", ".join(f"{k} {n}" for k, n in report.reward_errors.items())
        )
    if report.summary:
        lines.append("summary: " + escape(", ".join(f"{k} {_short(v)}" for k, v in report.summary.items())))
    return lines + [f"metrics: {escape(json.dumps(m))}" for m in report.metrics]


def _against_fit(report: LogReport, estimate: Estimate | None) -> None:
    """The run against its fit estimate (cost, HBM) and its warnings."""
    from tpuops.run.estimate import compare, lines

    against = compare(estimate, report)
    for line in lines(against):
        err.print(escape(line), highlight=False)
    for w in against["warnings"]:
        err.print(f"[bold yellow]warning[/] {escape(w)}")


def _short(v: object) -> str:
    """A summary value as people read it: floats to 4 significant digits."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _f(v: float | None, fmt: str = ".3f") -> str:
    return "" if v is None else format(v, fmt)


# How the steps table shows a field (any other: 6 significant digits).
TABLE_FORMATS = {"dt": ".2f", "rollout_generate": ".2f", "update": ".2f", "reward_mean": ".4f", "loss": ".6g",
                 "tokens_per_s": ".1f"}  # fmt: skip


def steps_table(report: LogReport) -> Table:
    """Step, then the log's own fields: the first few of its step lines, or the user's `columns`."""
    rows = report.rows
    shown = rows if len(rows) <= 2 * HEAD_ROWS else [*rows[:HEAD_ROWS], None, *rows[-HEAD_ROWS:]]
    stride = f", every {report.row_stride}th kept" if report.row_stride > 1 else ""
    cols = pick(report.fields, report.columns)
    cells = [
        ["…", *[""] * len(cols)] if r is None
        else [str(r.step), *(_f(value(r, c), TABLE_FORMATS.get(c, ".6g")) for c in cols)]
        for r in shown
    ]  # fmt: skip
    # Every number whole: at a narrow terminal the last fields are left out (the caption names them).
    heads = [
        Col("step", justify="right"),
        *(Col(escape(c), drop=k + 1, justify="right") for k, c in enumerate(cols)),
    ]
    return table_of(heads, cells, err.width, title=f"steps ({len(rows)} rows{stride})", title_justify="left")


def failures_table(report: LogReport) -> Table:
    counts = ", ".join(f"{k} {n}" for k, n in sorted(report.failure_counts.items()))
    rows = [
        [f"w{f.worker}", f.kind, str(f.line or ""), escape(f.message), escape(f.detail)]
        for f in report.failures
    ]
    heads = ["worker", "kind", "line", "message", "where"]
    return grid(heads, rows, title=f"failure signatures ({counts})", title_justify="left")


def baseline_table(deltas: list[Delta]) -> Table:
    rows = [
        [d.metric, f"{d.baseline:.4g}", f"{d.current:.4g}", f"{d.change:+.1%}",
         "[bold red]regressed[/]" if d.regressed else ""]
        for d in deltas
    ]  # fmt: skip
    heads = ["metric", "baseline", "now", "change", ""]
    return grid(heads, rows, title="against the baseline (+ is worse)", title_justify="left")
