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
    estimate: dict[str, Any] | None = None  # the run's fit estimate (result.json), for cost and HBM beside it


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
    from tpuops.run.estimate import saved

    deltas = None if baseline is None else load_baseline(baseline, report, threshold)
    est = saved(target) if not Path(target).expanduser().is_file() else None
    if html is not None:
        write_html(report, html, deltas, run_meta(target), est)
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


def exit_code(report: LogReport, deltas: list[Delta] | None = None) -> int:
    """1 on failure signatures or a baseline regression, 7 on compiles after the warm-up, else 0."""
    if report.failed or any(d.regressed for d in deltas or []):
        return int(ExitCode.FAILED)
    if report.recompiled:
        return int(ExitCode.RECOMPILE)
    return int(ExitCode.OK)


def as_dict(
    report: LogReport,
    code: int,
    deltas: list[Delta] | None,
    html: Path | None,
    estimate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from tpuops.run.estimate import compare

    return {
        "ok": code == 0,
        "exit_code": code,
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
    estimate: dict[str, Any] | None = None,
) -> None:
    Path(path).write_text(page(report, deltas, meta, estimate))


def chip_lines(report: LogReport) -> list[str]:
    """Each worker's chips at its latest sample, or why there are none."""
    if not report.chips:
        return [
            "chips: no HBM or duty-cycle fields in the log (a CPU backend exposes none, or an older trainer)"
        ]
    out = []
    for w, series in sorted(report.chips.items()):
        s = series[-1]
        hbm = chip_span(s, "hbm_gb", ".2f")
        peak = f" (peak {s['hbm_gb_peak']:.2f})" if "hbm_gb_peak" in s else ""
        duty = chip_span(s, "duty_pct", ".0f")
        out.append(
            f"chips w{w} at step {s['step']}: HBM {hbm or '-'}{' GB' if hbm else ''}{peak}"
            f"{f', duty {duty}%' if duty else ''} over {len(series)} samples"
        )
    return out


def chip_span(sample: dict[str, Any], prefix: str, fmt: str) -> str:
    """`min-max` of a chip sample's `PREFIX_min`/`PREFIX_max`, whichever of them it has ("" for neither): a
    step line may carry any of its optional fields."""
    found = [format(v, fmt) for k in ("min", "max") if isinstance(v := sample.get(f"{prefix}_{k}"), int | float)]
    return "-".join(found)


def render(
    report: LogReport,
    code: int,
    as_json: bool,
    deltas: list[Delta] | None,
    html: Path | None,
    estimate: dict[str, Any] | None = None,
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
    if report.chips:
        for line in chip_lines(report):
            err.print(escape(line), highlight=False)
    from tpuops.run.estimate import compare, lines

    against = compare(estimate, report)
    for line in lines(against):
        err.print(escape(line), highlight=False)
    for w in against["warnings"]:
        err.print(f"[bold yellow]warning[/] {escape(w)}")
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


# ---- the HTML page: one file, inline CSS and matplotlib's SVG, no script and nothing fetched ----
CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;background:#fff;max-width:1100px}
h1{font-size:20px;margin-bottom:4px}h2{font-size:16px;margin-top:28px}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#b00020;font-weight:bold}.ok{color:#1b7f3b;font-weight:bold}.warn{color:#b36b00;font-weight:bold}
pre{background:#f6f6f6;padding:6px;white-space:pre-wrap;font-size:12px}figure.chart{margin:6px 0}
figure.chart svg{max-width:100%;height:auto}.grid{display:grid;grid-template-columns:1fr 1fr;gap:4px 16px}
.note{color:#555;font-size:13px}table.meta th{background:#f3f3f3;width:9em}"""

NOT_LOGGED = (
    "not logged (JAX compile logging was off; `tpuops recompile-check`, --set compile_log=true for the bundled "
    "trainer, or JAX_LOG_COMPILES=1 for any JAX program turns it on)"
)


def _esc(v: object) -> str:
    return html_lib.escape(str(v))


def compiles_logged(report: LogReport) -> bool:
    """With logging on, step 0 always compiles: no compile at all in a run with steps means it was off."""
    return report.compiles.get("total", 0) > 0 or not report.steps


def _num(v: object, digits: int = 4) -> str:
    """A number as people read it: 4 significant digits, integers whole, no 16-digit floats."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if isinstance(v, int) or (float(v).is_integer() and abs(v) < 1e15):
        return str(int(v))
    return f"{v:.{digits}g}"


def _table(header: list[str], rows: list[list[object]], cls: str = "") -> str:
    th = "".join(f"<th>{_esc(h)}</th>" for h in header) if header else ""
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='num'>{_esc(_num(c))}</td>" if isinstance(c, int | float) and not isinstance(c, bool)
            else f"<td>{_esc(c)}</td>"
            for c in r
        )
        + "</tr>"
        for r in rows
    )  # fmt: skip
    head = f"<tr>{th}</tr>" if th else ""
    return f"<table{f' class={cls!r}' if cls else ''}>{head}{body}</table>"


def run_meta(target: str, runs_home: Path | None = None) -> dict[str, str] | None:
    """What run.json (and result.json) say of the run a report is about, when the target is a run id or a
    run directory: SOP, config, commit, target, start, duration, command line. None for a bare log file."""
    path = Path(target).expanduser()
    if not path.is_dir():
        if runs_home is None:
            from tpuops.config import state_home

            runs_home = state_home() / "runs"
        path = runs_home / target
    try:
        rec = json.loads((path / "run.json").read_text())
    except (OSError, ValueError):
        return None
    try:
        res = json.loads((path / "result.json").read_text())
    except (OSError, ValueError):
        res = {}
    import time

    values = rec.get("values") or {}
    t = rec.get("target") or {}
    where = t.get("vm") or ", ".join(t.get("hosts") or []) or "local"
    started = rec.get("started")
    meta = {
        "run": str(rec.get("run_id", path.name)),
        "SOP": str(rec.get("sop", "")),
        "config": " ".join(
            [str(values.get("config", "")), *map(str, values.get("trainer_sets") or [])]
        ).strip(),
        "commit": str(values.get("branch", "")),
        "target": f"{where} (workers {rec.get('workers')})",
        "start": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)) if started else "",
        "duration": f"{res['finished'] - started:.0f} s" if started and res.get("finished") else "",
        "command": " ".join(rec.get("argv") or []),
        "outcome": ""
        if not res
        else ("ok" if res.get("ok") else f"failed (exit code {res.get('exit_code')})"),
    }
    return {k: v for k, v in meta.items() if v}


def charts(report: LogReport) -> list[str]:
    """The page's charts, each an inline SVG from matplotlib (tpuops.run.charts)."""
    from tpuops.run.charts import Chart, Series, nice_ceiling, svg, values

    rows = report.rows
    xs = [r.step for r in rows]
    marks = sorted({c.step for c in report.recompiles if c.step is not None})
    warm = min(report.warmup, len(rows))
    rewards = [v for v in values(rows, "reward_mean") if v is not None and math.isfinite(v)]
    given = report.config_summary.get("max_reward", "")
    try:
        top = float(given)
    except ValueError:  # an older log: the data's own round ceiling (1 for rewards within 0..1)
        top = nice_ceiling(max([*rewards, 1e-9]))
    low = min([0.0, *rewards])
    out = [
        svg(Chart("dt", "step time (s, log scale; warm-up shaded, not scaled)", xs,
                  [Series(n, values(rows, n)) for n in ("dt", "rollout_generate", "update")],
                  log=True, warmup=warm, marks=marks)),
        svg(Chart("reward", f"reward_mean (axis: 0 to the task's max reward {top:g})", xs,
                  [Series("reward_mean", values(rows, "reward_mean"))], ylim=(low, top))),
    ]  # fmt: skip
    small = [
        Chart("entropy", "entropy (nats)", xs, [Series("entropy", values(rows, "entropy"))], ylim=(0.0, None)),
        Chart("grad_norm", "grad_norm", xs, [Series("grad_norm", values(rows, "grad_norm"))], ylim=(0.0, None)),
        Chart("kl_old", "kl_old", xs, [Series("kl_old", values(rows, "kl_old"))], ylim=(0.0, None)),
        Chart("clip_frac", "clip_frac (0..1)", xs, [Series("clip_frac", values(rows, "clip_frac"))], ylim=(0.0, 1.0)),
        Chart("tokens_per_s", "tokens/s (warm-up shaded)", xs, [Series("tokens/s", values(rows, "tokens_per_s"))],
              ylim=(0.0, None), warmup=warm),
    ]  # fmt: skip
    if compiles_logged(report) and report.steps:
        by_step: list[float | None] = [float(report.compiles_by_step.get(x, 0)) for x in xs]
        small.append(Chart("compiles", "compiles per step", xs, [Series("compiles", by_step)], ylim=(0.0, None),
                           bars=True))  # fmt: skip
    out.append('<div class="grid">' + "".join(svg(c, size=(3.8, 2.3)) for c in small) + "</div>")
    return out


def chip_charts(report: LogReport) -> list[str]:
    """HBM in use (min and max over each worker's chips) and duty cycle, per worker over the steps."""
    from tpuops.run.charts import Chart, Series, svg

    xs = sorted({s["step"] for series in report.chips.values() for s in series})
    hbm: list[Series] = []
    duty: list[Series] = []
    for w, series in sorted(report.chips.items()):
        by = {s["step"]: s for s in series}
        for key, label, into in (("hbm_gb_max", "max", hbm), ("hbm_gb_min", "min", hbm),
                                 ("duty_pct_max", "max", duty), ("duty_pct_min", "min", duty)):  # fmt: skip
            ys = [by[x].get(key) if x in by else None for x in xs]
            if any(y is not None for y in ys):
                into.append(Series(f"w{w} {label}", ys))
    limit = report.hbm_limit_gb
    out = []
    if hbm:
        out.append(Chart("hbm", "HBM in use per chip (GB; min and max over each worker's chips)", xs, hbm,
                         ylim=(0.0, limit)))  # fmt: skip
    if duty:
        out.append(
            Chart("duty", "duty cycle (%, min and max over each worker's chips)", xs, duty, ylim=(0.0, 100.0))
        )
    return [svg(c) for c in out]


def page(
    report: LogReport,
    deltas: list[Delta] | None = None,
    meta: dict[str, str] | None = None,
    estimate: dict[str, Any] | None = None,
) -> str:
    """The whole report as one self-contained HTML page (people would rather look than read)."""
    code = exit_code(report, deltas)
    verdict = {0: ("ok", "ok"), 7: ("warn", "recompiles after warm-up")}.get(code, ("bad", "failed"))
    rows = report.rows
    title = (meta or {}).get("run") or report.source
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>tpuops report {_esc(title)}</title>",
        f"<style>{CSS}</style></head><body><h1>tpuops report: {_esc(title)}</h1>",
        f'<p class="{verdict[0]}" id="verdict">{verdict[1]} (exit code {code})</p>',
    ]
    if meta:
        parts.append(_table([], [[k, v] for k, v in meta.items()], cls="meta"))
    first = next((r for r in rows if r.reward_mean is not None), None)
    last = next((r for r in reversed(rows) if r.reward_mean is not None), None)
    glance: list[list[object]] = [
        ["log", report.source],
        [
            "steps",
            f"{report.steps}" + (f" ({report.first_step}..{report.last_step})" if report.steps else ""),
        ],
        ["workers", ", ".join(f"w{w}" for w in report.workers)],
        ["warm-up", f"{report.warmup} step(s): compiles expected, left out of the steady state"],
    ]
    if first is not None and last is not None and last is not first:
        change = last.reward_mean - first.reward_mean  # type: ignore[operator]
        glance.append(["reward_mean", f"{first.reward_mean:.4f} at step {first.step} -> {last.reward_mean:.4f} at "
                                      f"step {last.step} ({change:+.4f})"])  # fmt: skip
    if report.dt:
        d = report.dt
        glance.append(
            [
                "steady step time",
                f"p50 {d.p50:.3f} s, mean {d.mean:.3f} s, p90 {d.p90:.3f} s over {d.n} steps",
            ]
        )
    if report.wandb_url or report.wandb:
        glance.append(["W&B", report.wandb_url or report.wandb or ""])
    parts.append("<h2>At a glance</h2>" + _table([], glance, cls="meta"))
    parts.append("<h2>Per step</h2>")
    if report.row_stride > 1:
        parts.append(f"<p class='note'>every {report.row_stride}th step of {report.steps} is plotted</p>")
    parts += charts(report)
    parts.append(
        "<p class='note'>loss is not plotted: in GRPO it is about 0 by construction (the advantages of a group sum to"
        " 0), so it says nothing about progress; its values are in the table below.</p>"
    )
    parts.append("<h2 id='chips'>Chips</h2>")
    if report.chips:
        parts += chip_charts(report)
        latest = [[f"w{w}", s["step"], i, *(_cell(v[i]) if v and i < len(v) else "" for v in
                   (s.get("hbm_gb_chips"), s.get("duty_pct_chips")))]
                  for w, ss in sorted(report.chips.items()) for s in ss[-1:]
                  for i in range(max(len(s.get("hbm_gb_chips") or []), len(s.get("duty_pct_chips") or []), 1))]  # fmt: skip
        parts.append(_table(["worker", "step", "chip", "HBM GB", "duty %"], latest, cls="chips"))
    else:
        parts.append(f"<p class='note' id='no-chips'>{_esc(chip_lines(report)[0])}</p>")
    from tpuops.run.estimate import compare, lines

    against = compare(estimate, report)
    if against["cost"] or against["hbm"]:
        parts.append(
            "<h2>Against the fit</h2>" + "".join(f"<p class='note'>{_esc(x)}</p>" for x in lines(against))
        )
        parts += [f"<p class='warn'>{_esc(w)}</p>" for w in against["warnings"]]
    if report.dt:
        d = report.dt
        parts.append("<h2>Steady state (from the warm-up on)</h2>")
        parts.append(
            _table(
                ["steps", "dt mean s", "dt p50 s", "dt p90 s", "dt min s", "dt max s", "rollout_generate s", "update s",
                 "tokens/s"],
                [[d.n, round(d.mean, 4), round(d.p50, 4), round(d.p90, 4), round(d.min, 4), round(d.max, 4),
                  *(round(v, 4) if v is not None else "" for v in
                    (report.rollout_generate_mean, report.update_mean, report.tokens_per_s_mean))]],
            )
        )  # fmt: skip
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
        ekeys = sorted({k for e in report.evals for k in e})
        parts.append("<h2>Eval</h2>" + _table(ekeys, [[e.get(k, "") for k in ekeys] for e in report.evals]))
    if deltas:
        parts.append("<h2>Against the baseline (+ is worse)</h2>")
        parts.append(
            _table(
                ["metric", "baseline", "now", "change", ""],
                [[d.metric, f"{d.baseline:.4g}", f"{d.current:.4g}", f"{d.change:+.1%}",
                  "regressed" if d.regressed else ""] for d in deltas],
            )
        )  # fmt: skip
    if report.summary:
        parts.append("<h2>Summary (the trainer's summary line)</h2>")
        parts.append(_table(["figure", "value"], [[k, v] for k, v in report.summary.items()]))
    if report.config_summary:
        parts.append(
            "<h2>Config</h2>"
            + _table(["setting", "value"], [[k, v] for k, v in report.config_summary.items()])
        )
    if rows:
        fields = ["step", "dt", "reward_mean", "reward_delta", "entropy", "kl_old", "clip_frac", "grad_norm",
                  "tokens_per_s", "rollout_generate", "update", "loss"]  # fmt: skip
        parts.append(f"<details><summary>every plotted step ({len(rows)} rows)</summary>")
        parts.append(_table(fields, [[_cell(getattr(r, f)) for f in fields] for r in rows]) + "</details>")
    return "".join(parts) + "</body></html>\n"


def _cell(v: float | int | None) -> object:
    return "" if v is None else v
