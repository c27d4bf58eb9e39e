"""Rendering of a LogReport (report.py's sibling): rich tables on stderr, JSON on stdout, one HTML page."""

from __future__ import annotations

import html as html_lib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from tpuops import jsonout
from tpuops.console import err, escape, out
from tpuops.errors import ExitCode, UsageError
from tpuops.logs.events import LogReport
from tpuops.run.baseline import Delta, compare

HEAD_ROWS = 10  # the terminal table shows the first and last steps; --json and --html have every kept row


@dataclass
class Reviewed:
    """`tpuops report`'s answer: the log's report, its comparison with a baseline, and the exit code."""

    report: LogReport
    deltas: list[Delta] | None
    code: int


def review(
    target: str,
    warmup: int,
    baseline: Path | None,
    threshold: float,
    html: Path | None,
    step_pattern: str | None = None,
) -> Reviewed:
    """Scan a log file, run directory or run id (with the user's step-line regex, when given); compare with a
    baseline; write the HTML page when asked."""
    from tpuops.logs.scanner import compile_step_pattern
    from tpuops.run import scan

    if step_pattern:
        compile_step_pattern(step_pattern)  # exit 2 naming it, before any file is read
    report = scan.scan_target(target, warmup, step_pattern=step_pattern)
    deltas = None if baseline is None else load_baseline(baseline, report, threshold)
    if html is not None:
        write_html(report, html, deltas)
    return Reviewed(report, deltas, exit_code(report, deltas))


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


def exit_code(report: LogReport, deltas: list[Delta] | None = None) -> int:
    """1 on failure signatures or a baseline regression, 7 on compiles after the warm-up, else 0."""
    if report.failed or any(d.regressed for d in deltas or []):
        return int(ExitCode.FAILED)
    if report.recompiled:
        return int(ExitCode.RECOMPILE)
    return int(ExitCode.OK)


def as_dict(report: LogReport, code: int, deltas: list[Delta] | None, html: Path | None) -> dict[str, Any]:
    return {
        "ok": code == 0,
        "exit_code": code,
        "report": report.to_dict(),
        "baseline": None if deltas is None else [d.__dict__ for d in deltas],
        "html": None if html is None else str(html),
    }


def write_html(report: LogReport, path: Path, deltas: list[Delta] | None = None) -> None:
    Path(path).write_text(page(report, deltas))


def render(
    report: LogReport, code: int, as_json: bool, deltas: list[Delta] | None, html: Path | None
) -> None:
    if as_json:
        out.print_json(jsonout.dumps(as_dict(report, code, deltas, html)))
        return
    span = f" ({report.first_step}..{report.last_step})" if report.steps else ""
    err.print(
        f"[bold]{escape(report.source)}[/]  workers {report.workers}  {report.lines} lines  "
        f"{report.steps} steps{span}, warm-up {report.warmup}"
    )
    if report.rows:
        err.print(steps_table(report))
    first, last = (report.rows[0], report.rows[-1]) if report.rows else (None, None)
    if (
        first
        and last
        and first.reward_mean is not None
        and last.reward_mean is not None
        and last is not first
    ):
        change = last.reward_mean - first.reward_mean
        err.print(
            f"reward_mean {first.reward_mean:.4f} at step {first.step} -> {last.reward_mean:.4f} at step "
            f"{last.step} ({change:+.4f})"
        )
    if report.dt:
        d = report.dt
        extra = "" if report.tokens_per_s_mean is None else f"  tokens/s mean {report.tokens_per_s_mean:.1f}"
        err.print(
            f"steady dt over {d.n} steps: mean {d.mean:.3f}s  p50 {d.p50:.3f}s  p90 {d.p90:.3f}s{extra}"
        )
    c = report.compiles
    if not compiles_logged(report):
        err.print(f"compiles: {NOT_LOGGED}")
    else:
        err.print(
            f"compiles: {c.get('total', 0)} total, {c.get('warmup', 0)} in warm-up, {c.get('eval', 0)} in "
            f"eval, {c.get('after_warmup', 0)} after warm-up, {c.get('open', 0)} after the last step"
        )
    for comp in report.recompiles:
        err.print(f"[bold yellow]recompile[/] at step {comp.step} (w{comp.worker}): {escape(comp.function)}")
        if comp.explanation:
            err.print(f"[dim]{escape(comp.explanation)}[/]")
    for e in report.evals:
        err.print("eval " + " ".join(f"{k}={v}" for k, v in e.items()))
    if report.wandb_url or report.wandb:
        err.print(f"W&B: {escape(report.wandb_url or report.wandb or '')}")
    if report.checkpoints:
        err.print(f"checkpoints: {report.checkpoints}, last {escape(report.last_checkpoint or '?')}")
    if report.reward_errors:
        err.print("reward function errors: " + ", ".join(f"{k} {n}" for k, n in report.reward_errors.items()))
    if report.summary:
        err.print("summary: " + escape(", ".join(f"{k} {_short(v)}" for k, v in report.summary.items())))
    for m in report.metrics:
        err.print(f"metrics: {escape(json.dumps(m))}")
    if report.failures:
        err.print(failures_table(report))
    if deltas:
        err.print(baseline_table(deltas))
    if html:
        err.print(f"wrote {html}")
    verdict = {0: "[green]ok[/]", 7: "[bold yellow]recompiles after warm-up[/]"}.get(
        code, "[bold red]failed[/]"
    )
    err.print(f"{verdict} (exit code {code})")


def _short(v: object) -> str:
    """A summary value as people read it: floats to 4 significant digits."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _f(v: float | None, fmt: str = ".3f") -> str:
    return "" if v is None else format(v, fmt)


def steps_table(report: LogReport) -> Table:
    rows = report.rows
    shown = rows if len(rows) <= 2 * HEAD_ROWS else [*rows[:HEAD_ROWS], None, *rows[-HEAD_ROWS:]]
    stride = f", every {report.row_stride}th kept" if report.row_stride > 1 else ""
    table = Table(title=f"steps ({len(rows)} rows{stride})", title_justify="left")
    for col in ("step", "dt", "rollout_generate", "update", "reward_mean", "loss", "tokens/s"):
        table.add_column(col, justify="right")
    for r in shown:
        if r is None:
            table.add_row("…", *[""] * 6)
            continue
        table.add_row(
            str(r.step),
            _f(r.dt, ".2f"),
            _f(r.rollout_generate, ".2f"),
            _f(r.update, ".2f"),
            _f(r.reward_mean, ".4f"),
            _f(r.loss, ".6f"),
            _f(r.tokens_per_s, ".1f"),
        )
    return table


def failures_table(report: LogReport) -> Table:
    counts = ", ".join(f"{k} {n}" for k, n in sorted(report.failure_counts.items()))
    table = Table(title=f"failure signatures ({counts})", title_justify="left")
    for col in ("worker", "kind", "line", "message", "where"):
        table.add_column(col)
    for f in report.failures:
        table.add_row(f"w{f.worker}", f.kind, str(f.line or ""), escape(f.message), escape(f.detail))
    return table


def baseline_table(deltas: list[Delta]) -> Table:
    table = Table(title="against the baseline (+ is worse)", title_justify="left")
    for col in ("metric", "baseline", "now", "change", ""):
        table.add_column(col)
    for d in deltas:
        mark = "[bold red]regressed[/]" if d.regressed else ""
        table.add_row(d.metric, f"{d.baseline:.4g}", f"{d.current:.4g}", f"{d.change:+.1%}", mark)
    return table


# ---- the HTML page: one file, inline CSS and SVG, no script and nothing fetched ----
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 760, 250, 64, 16, 40, 36
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e")
CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}.bad{color:#b00020;font-weight:bold}
.ok{color:#1b7f3b;font-weight:bold}.warn{color:#b36b00;font-weight:bold}pre{background:#f6f6f6;padding:6px;
white-space:pre-wrap;font-size:12px}svg.plot{border:1px solid #ddd;background:#fcfcfc;margin:6px 0}"""


def _esc(v: object) -> str:
    return html_lib.escape(str(v))


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


NOT_LOGGED = (
    "not logged (JAX compile logging was off; `tpuops recompile-check` or --set compile_log=true turns it on)"
)


def compiles_logged(report: LogReport) -> bool:
    """With logging on, step 0 always compiles: no compile at all in a run with steps means it was off."""
    return report.compiles.get("total", 0) > 0 or not report.steps


def svg_plot(
    plot_id: str, title: str, xs: list[int], series: list[tuple[str, list[float | None]]], marks: list[int]
) -> str:
    """A line plot as inline SVG: a polyline per series (gaps where values are missing), marks in red.
    Non-finite values (nan, inf) are gaps too, and the title says how many were skipped."""
    skipped = sum(y is not None and not math.isfinite(y) for _, ys in series for y in ys)
    series = [
        (label, [y if y is not None and math.isfinite(y) else None for y in ys]) for label, ys in series
    ]
    if skipped:
        title += f" ({skipped} non-finite value{'s' if skipped > 1 else ''} (nan/inf) not drawn)"
    pts = [(x, y) for _, ys in series for x, y in zip(xs, ys, strict=True) if y is not None]
    head = f'<svg class="plot" id="{plot_id}" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img">'
    head += f'<title>{_esc(title)}</title><text x="{PAD_L}" y="18" font-size="14">{_esc(title)}</text>'
    if not pts:
        return head + f'<text x="{W // 2}" y="{H // 2}" text-anchor="middle">no data</text></svg>'
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    x1 = x1 if x1 > x0 else x0 + 1
    if y1 <= y0:  # a flat series: an axis around its value, never a 1e-09-wide one that reads as noise
        y0, y1 = (y0 - abs(y0) * 0.1, y1 + abs(y0) * 0.1) if y0 else (0.0, 1.0)
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def sx(x: float) -> float:
        return PAD_L + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return PAD_T + (1 - (y - y0) / (y1 - y0)) * ph

    parts = [head, f'<rect x="{PAD_L}" y="{PAD_T}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    for t in _ticks(y0, y1):
        parts.append(
            f'<line x1="{PAD_L - 4}" x2="{PAD_L + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>'
        )
        parts.append(
            f'<text x="{PAD_L - 6}" y="{sy(t) + 4:.1f}" font-size="11" text-anchor="end">{t:.3g}</text>'
        )
    for t in sorted({round(t) for t in _ticks(x0, x1)}):  # steps are integers
        parts.append(f'<text x="{sx(t):.1f}" y="{H - 18}" font-size="11" text-anchor="middle">{t:.0f}</text>')
    parts.append(f'<text x="{PAD_L + pw / 2}" y="{H - 4}" font-size="11" text-anchor="middle">step</text>')
    for x in marks:
        if x0 <= x <= x1:
            at = f'x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{PAD_T}" y2="{PAD_T + ph}"'
            parts.append(f'<line class="mark" {at} stroke="#d62728" stroke-dasharray="4 3"/>')
    for i, (label, ys) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        runs: list[list[str]] = [[]]
        for x, y in zip(xs, ys, strict=True):
            if y is None:
                runs.append([])
            else:
                runs[-1].append(f"{sx(x):.1f},{sy(y):.1f}")
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{colour}"/>')
            elif run:
                parts.append(
                    f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(run)}"/>'
                )
        lx = PAD_L + pw - 140 * (len(series) - i)
        parts.append(f'<text x="{lx}" y="32" font-size="12" fill="{colour}">■ {_esc(label)}</text>')
    return "".join(parts) + "</svg>"


def _table(header: list[str], rows: list[list[object]]) -> str:
    th = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def page(report: LogReport, deltas: list[Delta] | None = None) -> str:
    """The whole report as one self-contained HTML page (people would rather look than read)."""
    code = exit_code(report, deltas)
    verdict = {0: ("ok", "ok"), 7: ("warn", "recompiles after warm-up")}.get(code, ("bad", "failed"))
    rows = report.rows
    xs = [r.step for r in rows]
    marks = sorted({c.step for c in report.recompiles if c.step is not None})
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>tpuops report {_esc(report.source)}</title>",
        f"<style>{CSS}</style></head><body><h1>tpuops report: {_esc(report.source)}</h1>",
        f'<p class="{verdict[0]}">{verdict[1]} (exit code {code})</p>',
        _table(
            ["workers", "lines", "steps", "first..last", "warm-up", "W&B"],
            [
                [
                    report.workers,
                    report.lines,
                    report.steps,
                    f"{report.first_step}..{report.last_step}",
                    report.warmup,
                    report.wandb_url or report.wandb or "-",
                ]
            ],
        ),
    ]
    if report.dt:
        d = report.dt
        parts.append("<h2>Steady state (from the warm-up on)</h2>")
        parts.append(
            _table(
                ["steps", "dt mean", "dt p50", "dt p90", "rollout_generate", "update", "tokens/s"],
                [
                    [
                        d.n,
                        f"{d.mean:.3f}s",
                        f"{d.p50:.3f}s",
                        f"{d.p90:.3f}s",
                        _f(report.rollout_generate_mean),
                        _f(report.update_mean),
                        _f(report.tokens_per_s_mean, ".1f"),
                    ]
                ],
            )
        )
    parts.append("<h2>Per step</h2>")
    if report.row_stride > 1:
        parts.append(f"<p>every {report.row_stride}th step of {report.steps} is plotted</p>")
    timing = [
        ("dt", [r.dt for r in rows]),
        ("rollout_generate", [r.rollout_generate for r in rows]),
        ("update", [r.update for r in rows]),
    ]
    parts.append(svg_plot("plot-dt", "step time (s); dashed: recompiles", xs, timing, marks))
    parts.append(
        svg_plot("plot-reward", "reward_mean", xs, [("reward_mean", [r.reward_mean for r in rows])], [])
    )
    parts.append(svg_plot("plot-loss", "loss", xs, [("loss", [r.loss for r in rows])], []))
    c = report.compiles
    parts.append("<h2>Compiles</h2>")
    keys = ["total", "warmup", "eval", "after_warmup", "open"]
    logged = compiles_logged(report)
    parts.append(
        _table(
            ["total", "warm-up", "eval", "after warm-up", "after the last step"],
            [[c.get(k, 0) if logged else "not logged" for k in keys]],
        )
    )
    if not logged:
        parts.append(f"<p class='warn'>compiles: {_esc(NOT_LOGGED)}</p>")
    for comp in report.recompiles:
        parts.append(
            f"<p class='warn'>recompile at step {comp.step} (w{comp.worker}): {_esc(comp.function)}</p>"
        )
        if comp.explanation:
            parts.append(f"<pre>{_esc(comp.explanation)}</pre>")
    if report.failures:
        parts.append("<h2>Failure signatures</h2>")
        parts.append(
            _table(
                ["worker", "kind", "line", "message", "where"],
                [[f"w{f.worker}", f.kind, f.line, f.message, f.detail] for f in report.failures],
            )
        )
    if report.evals:
        keys = sorted({k for e in report.evals for k in e})
        parts.append("<h2>Eval</h2>" + _table(keys, [[e.get(k, "") for k in keys] for e in report.evals]))
    if deltas:
        parts.append("<h2>Against the baseline (+ is worse)</h2>")
        parts.append(
            _table(
                ["metric", "baseline", "now", "change", ""],
                [
                    [
                        d.metric,
                        f"{d.baseline:.4g}",
                        f"{d.current:.4g}",
                        f"{d.change:+.1%}",
                        "regressed" if d.regressed else "",
                    ]
                    for d in deltas
                ],
            )
        )
    if report.summary:
        parts.append(f"<h2>Summary</h2><pre>{_esc(json.dumps(report.summary, indent=1))}</pre>")
    return "".join(parts) + "</body></html>\n"
