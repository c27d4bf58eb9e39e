"""The report page's charts chosen from a log: step time, then the trainer's GRPO panels only when its fields are
there, any other run's loss and the fields its steps table shows, and the chips; drawn by tpuops.run.charts."""

from __future__ import annotations

import math

from tpuops.logs.events import ChipField, LogReport
from tpuops.logs.fields import NOT_SHOWN, pick, value
from tpuops.run.logtext import compiles_logged

# The bundled trainer's GRPO panels (beside step time and reward), each drawn only when its field is there.
GRPO_SMALL = (
    ("entropy", "entropy (nats)", (0.0, None)),
    ("grad_norm", "grad_norm", (0.0, None)),
    ("kl_old", "kl_old", (0.0, None)),
    ("clip_frac", "clip_frac (0..1)", (0.0, 1.0)),
)
TIMES = ("dt", "rollout_generate", "update")  # seconds per step: one chart, log scale
MAX_OTHER_CHARTS = 8  # other fields charted (those the steps table shows)


def grpo(report: LogReport) -> bool:
    """The log is the bundled trainer's GRPO (its reward is on the step lines): its panels and notes apply."""
    return "reward_mean" in report.fields


def charts(report: LogReport) -> list[str]:
    """The page's charts, each an inline SVG from matplotlib (tpuops.run.charts): only fields the log has."""
    from tpuops.run.charts import Chart, Series, nice_ceiling, svg

    rows, has = report.rows, set(report.fields)
    xs = [r.step for r in rows]

    def ys(name: str) -> list[float | None]:
        return [value(r, name) for r in rows]

    marks = sorted({c.step for c in report.recompiles if c.step is not None})
    warm = min(report.warmup, len(rows))
    out: list[str] = []
    times = [n for n in TIMES if n in has]
    if times:
        out.append(svg(Chart("dt", "step time (s, log scale; warm-up shaded, not scaled)", xs,
                             [Series(n, ys(n)) for n in times], log=True, warmup=warm, marks=marks)))  # fmt: skip
    charted = {*TIMES}
    small: list[Chart] = []
    if grpo(report):
        rewards = [v for v in ys("reward_mean") if v is not None and math.isfinite(v)]
        given = report.config_summary.get("max_reward", "")
        try:
            top = float(given)
        except ValueError:  # an older log: the data's own round ceiling (1 for rewards within 0..1)
            top = nice_ceiling(max([*rewards, 1e-9]))
        low = min([0.0, *rewards])
        out.append(svg(Chart("reward", f"reward_mean (axis: 0 to the task's max reward {top:g})", xs,
                             [Series("reward_mean", ys("reward_mean"))], ylim=(low, top))))  # fmt: skip
        small += [
            Chart(n, title, xs, [Series(n, ys(n))], ylim=lim) for n, title, lim in GRPO_SMALL if n in has
        ]
        charted |= {"reward_mean", "loss", *(n for n, _, _ in GRPO_SMALL)}  # GRPO's loss: see the note
    elif "loss" in has:
        out.append(svg(Chart("loss", "loss", xs, [Series("loss", ys("loss"))], marks=marks)))
        charted.add("loss")
    if "tokens_per_s" in has:
        small.append(Chart("tokens_per_s", "tokens/s (warm-up shaded)", xs, [Series("tokens/s", ys("tokens_per_s"))],
                           ylim=(0.0, None), warmup=warm))  # fmt: skip
        charted.add("tokens_per_s")
    others = [n for n in pick(report.fields, report.columns) if n not in charted and n not in NOT_SHOWN]
    small += [Chart(_id(n), n, xs, [Series(n, ys(n))]) for n in others[:MAX_OTHER_CHARTS]]
    if compiles_logged(report) and report.steps:
        by_step: list[float | None] = [float(report.compiles_by_step.get(x, 0)) for x in xs]
        small.append(Chart("compiles", "compiles per step", xs, [Series("compiles", by_step)], ylim=(0.0, None),
                           bars=True))  # fmt: skip
    if small:
        out.append('<div class="grid">' + "".join(svg(c, size=(3.8, 2.3)) for c in small) + "</div>")
    return out


def _id(name: str) -> str:
    """A field's name as a chart's id (ids hold no dots: `eval.acc` -> `eval-acc`)."""
    return "".join(c if c.isalnum() or c in "_-" else "-" for c in name)


def chip_charts(report: LogReport) -> list[str]:
    """HBM in use (min and max over each worker's chips) and duty cycle, per worker over the steps."""
    from tpuops.run.charts import Chart, Series, svg

    xs = sorted({s["step"] for series in report.chips.values() for s in series})
    hbm: list[Series] = []
    duty: list[Series] = []
    for w, series in sorted(report.chips.items()):
        by = {s["step"]: s for s in series}
        lines: tuple[tuple[ChipField, str, list[Series]], ...] = (
            ("hbm_gb_max", "max", hbm), ("hbm_gb_min", "min", hbm),
            ("duty_pct_max", "max", duty), ("duty_pct_min", "min", duty),
        )  # fmt: skip
        for key, label, into in lines:
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
