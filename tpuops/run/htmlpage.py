"""`tpuops report --html`: the whole report as one page (inline CSS and matplotlib's SVG, no script, nothing
fetched). Its charts are the log's own fields: step time, then the trainer's GRPO panels only when its fields are
there, any other run's loss and the fields its steps table shows; the chips; the run's record at the top."""

from __future__ import annotations

import html as html_lib
import json
from pathlib import Path

from tpuops.logs.events import LogReport
from tpuops.logs.fields import NOT_SHOWN, pick, value
from tpuops.run.baseline import Delta
from tpuops.run.estimate import Estimate
from tpuops.run.logtext import NOT_LOGGED, chip_lines, compiles_logged, exit_code
from tpuops.run.pagecharts import TIMES, charts, chip_charts, grpo

CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;background:#fff;max-width:1100px}
h1{font-size:20px;margin-bottom:4px}h2{font-size:16px;margin-top:28px}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#b00020;font-weight:bold}.ok{color:#1b7f3b;font-weight:bold}.warn{color:#b36b00;font-weight:bold}
pre{background:#f6f6f6;padding:6px;white-space:pre-wrap;font-size:12px}figure.chart{margin:6px 0}
figure.chart svg{max-width:100%;height:auto}.grid{display:grid;grid-template-columns:1fr 1fr;gap:4px 16px}
.note{color:#555;font-size:13px}table.meta th{background:#f3f3f3;width:9em}"""


def _esc(v: object) -> str:
    return html_lib.escape(str(v))


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


def run_folder(target: str, runs_home: Path | None = None) -> Path:
    """The run folder a report's target names: a run directory as given, else a run id under the runs home."""
    path = Path(target).expanduser()
    if not path.is_dir():
        if runs_home is None:
            from tpuops.config import state_home

            runs_home = state_home() / "runs"
        path = runs_home / target
    return path


def profile_section(target: str) -> str | None:
    """The page's profile section when the run traced chosen steps (`--profile-steps`): each worker's top ops
    and phase split over those steps; None when it traced none (or the target is a bare log file)."""
    from tpuops.run.profile import STEPS_DIR, asked_steps, summarise_folder
    from tpuops.run.profileview import html_section

    path = run_folder(target)
    try:
        steps = asked_steps(json.loads((path / "run.json").read_text()).get("values") or {})
    except (OSError, ValueError):
        return None
    found = summarise_folder(path / STEPS_DIR, steps) if steps else {}
    return html_section(found, f"steps {steps[0]}-{steps[1]}") if steps and found else None


def run_meta(target: str, runs_home: Path | None = None) -> dict[str, str] | None:
    """What run.json (and result.json) say of the run a report is about, when the target is a run id or a
    run directory: SOP, config, commit, target, start, duration, command line. None for a bare log file."""
    path = run_folder(target, runs_home)
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
        else "ok"
        if res.get("ok")
        else f"{'stopped' if res.get('stopped') else 'failed'} (exit code {res.get('exit_code')})",
    }
    return {k: v for k, v in meta.items() if v}


def page(
    report: LogReport,
    deltas: list[Delta] | None = None,
    meta: dict[str, str] | None = None,
    estimate: Estimate | None = None,
    profile: str | None = None,
) -> str:
    """The whole report as one self-contained HTML page (people would rather look than read); `profile`: the
    section of a run's traced steps (`profile_section`)."""
    parts = _head(report, deltas, meta)
    parts.append("<h2>At a glance</h2>" + _table([], _glance(report), cls="meta"))
    parts += _per_step(report)
    parts += _chips_section(report)
    parts += _against_fit(report, estimate)
    parts += _steady(report)
    if profile:
        parts.append(f"<section id='profile'>{profile}</section>")
    parts += _compiles(report)
    parts += _tables(report, deltas)
    return "".join(parts) + "</body></html>\n"


def _head(report: LogReport, deltas: list[Delta] | None, meta: dict[str, str] | None) -> list[str]:
    """The page's head, its title and verdict line, and the run's record when there is one."""
    code = exit_code(report, deltas)
    verdict = {0: ("ok", "ok"), 7: ("warn", "recompiles after warm-up")}.get(code, ("bad", "failed"))
    title = (meta or {}).get("run") or report.source
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>tpuops report {_esc(title)}</title>",
        f"<style>{CSS}</style></head><body><h1>tpuops report: {_esc(title)}</h1>",
        f'<p class="{verdict[0]}" id="verdict">{verdict[1]} (exit code {code})</p>',
    ]
    if meta:
        parts.append(_table([], [[k, v] for k, v in meta.items()], cls="meta"))
    return parts


def _glance(report: LogReport) -> list[list[object]]:
    """The at-a-glance rows: the log, its steps and workers, how the reward (or the first fields) moved."""
    rows = report.rows
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
    if not grpo(report):
        for name in pick(report.fields, report.columns)[:4]:
            if name in TIMES:
                continue
            have = [r for r in rows if value(r, name) is not None]
            if len(have) > 1:
                a, b = have[0], have[-1]
                glance.append([name, f"{_num(value(a, name))} at step {a.step} -> {_num(value(b, name))} at step "
                                     f"{b.step}"])  # fmt: skip
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
    return glance


def _per_step(report: LogReport) -> list[str]:
    """The per-step charts, with the notes on what is plotted."""
    parts = ["<h2>Per step</h2>"]
    if report.row_stride > 1:
        parts.append(f"<p class='note'>every {report.row_stride}th step of {report.steps} is plotted</p>")
    parts += charts(report)
    if grpo(report) and "loss" in report.fields:
        parts.append(
            "<p class='note'>loss is not plotted: in GRPO it is about 0 by construction (the advantages of a group sum"
            " to 0), so it says nothing about progress; its values are in the table below.</p>"
        )
    return parts


def _chips_section(report: LogReport) -> list[str]:
    """The chips: their charts and each worker's latest figures per chip, or why there are none."""
    parts = ["<h2 id='chips'>Chips</h2>"]
    if report.chips:
        parts += chip_charts(report)
        latest = [[f"w{w}", s["step"], i, *(_cell(v[i]) if v and i < len(v) else "" for v in
                   (s.get("hbm_gb_chips"), s.get("duty_pct_chips")))]
                  for w, ss in sorted(report.chips.items()) for s in ss[-1:]
                  for i in range(max(len(s.get("hbm_gb_chips") or []), len(s.get("duty_pct_chips") or []), 1))]  # fmt: skip
        parts.append(_table(["worker", "step", "chip", "HBM GB", "duty %"], latest, cls="chips"))
    else:
        parts.append(f"<p class='note' id='no-chips'>{_esc(chip_lines(report)[0])}</p>")
    return parts


def _against_fit(report: LogReport, estimate: Estimate | None) -> list[str]:
    """The run against its fit estimate (cost and HBM), when the run has one."""
    from tpuops.run.estimate import compare, lines

    against = compare(estimate, report)
    if not (against["cost"] or against["hbm"]):
        return []
    parts = ["<h2>Against the fit</h2>" + "".join(f"<p class='note'>{_esc(x)}</p>" for x in lines(against))]
    return parts + [f"<p class='warn'>{_esc(w)}</p>" for w in against["warnings"]]


def _steady(report: LogReport) -> list[str]:
    """The steady state's step-time statistics and phase means, when the log has step times."""
    if not report.dt:
        return []
    d = report.dt
    means = [(h, v) for h, v in (("rollout_generate s", report.rollout_generate_mean),
                                 ("update s", report.update_mean), ("tokens/s", report.tokens_per_s_mean))
             if v is not None]  # fmt: skip
    table = _table(
        ["steps", "dt mean s", "dt p50 s", "dt p90 s", "dt min s", "dt max s", *(h for h, _ in means)],
        [[d.n, round(d.mean, 4), round(d.p50, 4), round(d.p90, 4), round(d.min, 4), round(d.max, 4),
          *(round(v, 4) for _, v in means)]],
    )  # fmt: skip
    return ["<h2>Steady state (from the warm-up on)</h2>", table]


def _compiles(report: LogReport) -> list[str]:
    """The compile counts by window and each recompile after the warm-up, with its explanation."""
    c = report.compiles
    parts = ["<h2>Compiles</h2>"]
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
    return parts


def _tables(report: LogReport, deltas: list[Delta] | None) -> list[str]:
    """The page's closing tables: failures, evals, the baseline, the summary, the config, every step."""
    parts: list[str] = []
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
    return parts + _every_step(report)


def _every_step(report: LogReport) -> list[str]:
    """Every plotted step's fields, folded away."""
    rows = report.rows
    if not rows:
        return []
    shown = [f for f in report.fields if f not in NOT_SHOWN]
    return [
        f"<details><summary>every plotted step ({len(rows)} rows)</summary>",
        _table(["step", *shown], [[r.step, *(_cell(value(r, f)) for f in shown)] for r in rows])
        + "</details>",
    ]


def _cell(v: float | int | None) -> object:
    return "" if v is None else v
