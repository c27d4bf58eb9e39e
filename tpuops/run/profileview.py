"""A profile's summary as people read it: the terminal's top-ops table, busy vs idle, steps and phases, and the
same as a small HTML section of the run's report page."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from tpuops.console import emit_json, err, escape

if TYPE_CHECKING:
    from tpuops.logs.trace import TraceSummary
    from tpuops.run.profile import Profiled


NO_WHOLE_STEP = (
    "no step seen whole: the profiler keeps a step's annotation only when the step starts and ends inside the "
    "capture (phases, being shorter, fit); capture longer than two steps (--seconds) to see steps"
)


def summary_lines(s: TraceSummary, top: int = 10) -> list[str]:
    """Plain lines: the top ops by device time with their share, busy vs idle, the steps and phases seen."""
    device = f"{s.devices} {s.device}" if s.device != "CPU" else "CPU (the host is the device)"
    lines = [
        f"device {device}: busy {s.busy_ms:.1f} ms of {s.window_ms:.1f} ms ({s.busy_share:.0%}), "
        f"idle {max(0.0, s.window_ms - s.busy_ms):.1f} ms"
    ]
    if s.steps:
        per = f", {s.step_ms:.1f} ms a step" if s.step_ms is not None else ""
        seen = f"step {s.steps[0]}" if len(s.steps) == 1 else f"steps {s.steps[0]}-{s.steps[-1]}"
        lines.append(f"{seen} seen whole ({len(s.steps)}{per})")
    elif s.phases:  # JAX keeps an annotation only when it starts and ends inside the capture
        lines.append(NO_WHOLE_STEP)
    if s.phases:
        whole = sum(s.phases.values()) or 1.0
        lines.append("phases: " + ", ".join(f"{k} {v:.1f} ms ({v / whole:.0%})" for k, v in s.phases.items()))
    width = max((len(o.name) for o in s.ops[:top]), default=2)
    width = min(max(width, 2), 60)
    lines.append(f"{'op':<{width}}  {'ms':>9}  {'share':>6}  {'count':>6}")
    for o in s.ops[:top]:
        name = o.name if len(o.name) <= width else o.name[: width - 1] + "…"
        lines.append(f"{name:<{width}}  {o.ms:>9.2f}  {o.share:>6.1%}  {o.count:>6}")
    if not s.ops:
        lines.append("(no ops in the capture: was the job between steps, compiling, or stopped?)")
    return lines


def render(p: Profiled, as_json: bool, top: int = 10) -> None:
    if as_json:
        emit_json(p.to_dict(top))
        return
    for w, t in sorted(p.traces.items()):
        err.print(f"[cyan]\\[w{w}][/cyan] trace {t.xplane_bytes:,} bytes in {escape(str(t.folder))}")
        s = t.summary
        if p.steps and (not s.steps or s.steps[0] > p.steps[0] or s.steps[-1] < p.steps[1]):
            seen = f"{s.steps[0]}-{s.steps[-1]}" if s.steps else "none"
            err.print(
                f"[yellow]steps {p.steps[0]}-{p.steps[1]} are not all in this capture (steps seen: {seen}); "
                "the summary covers what was seen[/]"
            )
        for line in summary_lines(s, top):
            err.print(f"  {escape(line)}", highlight=False)
    for _, why in sorted(p.errors.items()):
        err.print(f"[bold red]error[/]: {escape(why)}")
    if p.traces:
        for line in p.open_commands():
            err.print(f"open: {escape(line)}", highlight=False)


def steps_lines(p: Profiled, top: int = 8) -> list[str]:
    """The end report's profile of `--profile-steps A-B`: per worker the summary, then why a worker has none."""
    assert p.steps is not None
    lines = []
    for w, t in sorted(p.traces.items()):
        lines.append(
            f"profile of steps {p.steps[0]}-{p.steps[1]}, w{w} ({t.xplane_bytes:,} bytes in {t.folder}):"
        )
        lines += [f"  {line}" for line in summary_lines(t.summary, top)]
    lines += [f"profile: {why}" for _, why in sorted(p.errors.items())]
    if p.traces:
        lines += [f"open: {line}" for line in p.open_commands()]
    return lines


def html_section(summaries: dict[int, TraceSummary], label: str, top: int = 8) -> str:
    """The report page's profile section: per worker, busy vs idle, the phase split and a top-ops table."""
    parts = [f"<h2>Profile: {html.escape(label)}</h2>"]
    for w, s in sorted(summaries.items()):
        parts.append(f"<h3>worker {w}</h3><p>{html.escape(summary_lines(s, 0)[0])}</p>")
        if s.phases:
            whole = sum(s.phases.values()) or 1.0
            cells = "".join(
                f"<tr><td>{html.escape(k)}</td><td>{v:.1f}</td><td>{v / whole:.0%}</td></tr>"
                for k, v in s.phases.items()
            )
            parts.append(
                '<table class="profile-phases"><tr><th>phase</th><th>ms</th><th>share</th></tr>'
                f"{cells}</table>"
            )
        rows = "".join(
            f"<tr><td>{html.escape(o.name)}</td><td>{o.ms:.2f}</td><td>{o.share:.1%}</td><td>{o.count}</td></tr>"
            for o in s.ops[:top]
        )
        parts.append(
            '<table class="profile-ops"><tr><th>op</th><th>ms</th><th>share</th><th>count</th></tr>'
            f"{rows}</table>"
        )
    return "\n".join(parts)
