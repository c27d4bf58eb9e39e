"""A run's reports: the SOP report, the dry-run plan, the SOP list, the runs table, stop, doctor and top (bench's
tables: benchview.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from tpuops.console import Col, emit_json, err, escape, grid, out, status_cell, table_of, table_width
from tpuops.logs.events import at_step
from tpuops.run.recover import notice_words
from tpuops.run.result import Recovery, RunResult
from tpuops.sop.actions import render_plan, summarize_plan

if TYPE_CHECKING:  # the renderers' inputs, named for the type checker (imported at use by the commands)
    from rich.table import Table

    from tpuops.run.detached import RunState
    from tpuops.run.health import Doctored
    from tpuops.run.top import Top
    from tpuops.sop.executor import StepReport
    from tpuops.sop.procedure import Sop
    from tpuops.transport.base import CmdResult


def step_done(step: StepReport) -> None:
    bad = step.failed
    mark = "[red]✗[/red]" if bad else "[green]✓[/green]"
    summary = ", ".join(sorted({o.status for o in step.outcomes.values()}))
    err.print(f"{mark} {step.title} ({summary}, {step.duration_s:.2f}s)")


def sop_report(report: RunResult, as_json: bool) -> None:
    """A finished run as a table on stderr (or its --json on stdout): the steps, the cause, the log's report."""
    code = int(report.code)
    if as_json:
        emit_json(report.to_dict())
        return
    err.print(_steps_table(report))
    _why(report, code)
    for rec in report.recoveries:
        err.print(recovery_line(rec))
    if report.log is not None and report.log.metrics:
        from tpuops.run.benchview import metrics_table, microbench_table

        benches = [m for m in report.log.metrics if m.get("kind") == "microbench"]
        if benches:
            err.print(microbench_table(benches))
        for m in report.log.metrics:
            if m.get("kind") != "microbench":
                err.print(metrics_table(m))
    elif report.log is not None:
        from tpuops.run import logreport

        logreport.render(report.log, code, False, None, None, report.estimate)
    if report.profile is not None:  # --profile-steps: the top ops and phases of those steps
        from tpuops.run.profileview import steps_lines

        for line in steps_lines(report.profile):
            err.print(escape(line), highlight=False)
    err.print(f"done in {report.duration_s:.2f}s, run {report.run_id}, exit code {code}")


def _steps_table(report: RunResult) -> Table:
    """Each step's outcome per worker; on a narrow terminal one row per step and worker."""
    # Each worker's detail wraps between words (a path with the run id in it stays whole): nothing is cut.
    cols = [Col("step", "wrap"), *(Col(f"w{w}", "wrap") for w in report.workers)]
    rows = [
        [escape(s.title), *("" if (o := s.outcomes.get(w)) is None else status_cell(o.status, o.detail)
                            for w in report.workers)]
        for s in report.steps
    ]  # fmt: skip
    title = f"{report.sop}  run {report.run_id}  ({report.transport})"
    if len(report.workers) > 1 and table_width(cols, rows) > err.width:  # narrow: one row per step and worker
        cols = [Col("step", "wrap"), Col("worker"), Col("outcome", "wrap")]
        rows = [
            [escape(s.title) if k == 0 else "", f"w{w}", status_cell(o.status, o.detail)]
            for s in report.steps
            for k, (w, o) in enumerate(sorted(s.outcomes.items()))
        ]
    return table_of(cols, rows, err.width, title=title, title_justify="left")


def _why(report: RunResult, code: int) -> None:
    """The first failed step, the log's cause, the fix, and the py-spy dump of a worker that hung."""
    failure = report.first_failure()
    if failure:
        step, worker, outcome = failure
        err.print(f"[bold red]failed[/]: step {step.title} on w{worker}: {escape(outcome.detail)}")
    cause = report.log.cause() if report.log is not None else None
    if cause is not None and code:
        err.print(f"[bold red]cause[/] ({cause.kind}, w{cause.worker}): {escape(cause.message)}")
    if report.hint:
        err.print(f"[bold]fix[/]: {escape(report.hint)}")
    for s in report.steps:
        for w, o in sorted(s.outcomes.items()):
            if o.data.get("py_spy"):
                err.print(
                    f"[bold]py-spy dump of w{w}[/] (the job's Python stacks when it stopped making progress):"
                )
                err.print(escape(str(o.data["py_spy"]).rstrip()))


def recovery_line(rec: Recovery) -> str:
    """One recovery of the run: why the VM was lost, where the run stood, how long it took, what was lost."""
    resumed = (
        "no step line after it" if rec["resumed_step"] is None else f"resumed at step {rec['resumed_step']}"
    )
    lost = "steps lost unknown" if rec["steps_lost"] is None else f"steps lost {rec['steps_lost']}"
    kept = f"{notice_words(rec.get('notice_checkpoint'))}; " if rec.get("notice") else ""
    return (
        f"recovered: the VM {rec.get('why', 'was PREEMPTED')} {at_step(rec['last_step'])}; "
        f"{kept}{rec['duration_s']}s to recreate, {resumed}, {lost}"
    )


def dry_run(dr: RunResult, as_json: bool, *, verbose: bool = False) -> None:
    """A dry run's plan (RunResult.planned): the plan on stdout (one line per step per worker; `verbose`: every
    command in full), what it is for and what it found on stderr."""
    planned = dr.planned
    assert planned is not None, "not a dry run"
    if as_json:
        emit_json(dr.to_dict())
        return
    err.print(f"[bold]plan for {dr.sop}[/] on {dr.transport} workers {dr.workers} (nothing was run)")
    vm = getattr(planned.target, "vm", None)
    if vm is not None:
        from tpuops.cloud.backends import backend_of

        words = backend_of(vm).words
        err.print(
            escape(f"VM {vm.name} in {vm.zone}: {words} ({vm.accelerator_type}, {len(vm.workers)} workers)")
        )
    if planned.fit:
        err.print(f"fit: {escape(planned.fit)}")
    cost = (dr.estimate or {}).get("cost")
    if isinstance(cost, dict):
        from tpuops.cloud.pricing import cost_line

        err.print(escape(cost_line(dict(cost))), highlight=False)
    out.out((render_plan if verbose else summarize_plan)(planned.plan), end="", highlight=False)
    for p in planned.preview:  # after the plan, where the eye ends: what the run would discard on each worker
        err.print(escape(p.line()), highlight=False)


def dry_runs(labelled: list[tuple[str, RunResult]], as_json: bool, *, verbose: bool = False) -> None:
    """The plans of several runs of one command (bench variants), each under its label."""
    if as_json:
        data = [{"variant": label, **dr.to_dict()} for label, dr in labelled]
        emit_json(data)
        return
    for label, dr in labelled:
        err.print(f"[bold]variant {escape(label)}[/]")
        dry_run(dr, False, verbose=verbose)


def sop_list(
    rows: list[tuple[str, str, str, str]], as_json: bool, broken: Sequence[tuple[str, str]] = ()
) -> None:
    """The valid SOPs (user or built-in), then each file that does not load with its error (`error` in JSON)."""
    if as_json:
        ok = [{"name": n, "description": d, "path": p, "origin": o, "error": None} for n, d, p, o in rows]
        bad = [
            {"name": Path(p).stem, "description": "", "path": p, "origin": None, "error": e}
            for p, e in broken
        ]
        emit_json(ok + bad)
        return
    # The name stays whole; the file, then where it is from, give way; a description is cut with an ellipsis.
    cols = [Col("SOP"), Col("from", "wrap", 2), Col("description", "prose"), Col("file", drop=1)]
    out.print(table_of(cols, [[escape(n), o, escape(d), escape(p)] for n, d, p, o in rows], out.width))
    for p, e in broken:  # the loader's message starts with the file (and line) already
        err.print(f"[bold red]broken SOP[/] {escape(e if e.startswith(p) else f'{p}: {e}')}")


def sop_show(sop: Sop, path: str, as_json: bool) -> None:
    if as_json:
        emit_json({"path": path, **sop.model_dump()})
        return
    out.print(f"[bold]{sop.name}[/]  ({path})\n{sop.description}\n")
    params = [[name, p.type, p.shown_default, p.description] for name, p in sop.params.items()]
    heads = ["parameter", "type", "default", "description"]
    out.print(grid(heads, params, title="parameters", title_justify="left"))
    steps = [[str(i), s.title, s.kind] for i, s in enumerate(sop.steps)]
    out.print(grid(["#", "step", "kind"], steps, title="steps", title_justify="left"))


class RunRow(TypedDict):
    """One run of `tpuops runs --json`."""

    run_id: str
    sop: str
    target: str
    workers: list[int]
    started: str
    status: str
    detail: str


class WorkerStopped(TypedDict):
    """One worker of `tpuops stop --json`: whether its job was stopped, and what it said."""

    ok: bool
    detail: str


def runs_table(states: list[RunState], as_json: bool) -> None:
    """`tpuops runs`: each run's state (run/detached.RunState), and why when it could not be known."""
    import time

    rows: list[RunRow] = []  # the --json rows (workers is a list there, text in the table)
    for st in states:
        r = st.record
        vm, hosts = r.target.get("vm"), r.target.get("hosts")
        where = str(vm) if vm else ",".join(map(str, hosts)) if isinstance(hosts, list) and hosts else "local"
        rows.append(
            {
                "run_id": r.run_id,
                "sop": r.sop,
                "target": where,
                "workers": r.workers,
                "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started)),
                "status": st.state,
                "detail": st.detail,
            }
        )
    if as_json:
        emit_json(rows)
        return
    # The run id and target stay whole (the next command takes them); workers, started, then the SOP (the run
    # id ends with its name) give way.
    cols = [Col("run"), Col("SOP", drop=1), Col("target"), Col("workers", "wrap", 3), Col("started", "wrap", 2),
            Col("status", "wrap")]  # fmt: skip
    cells = [
        [row["run_id"], row["sop"], escape(row["target"]), ",".join(map(str, row["workers"])), row["started"],
         escape(f"{row['status']} ({row['detail']})" if row["detail"] else row["status"])]
        for row in rows
    ]  # fmt: skip
    out.print(table_of(cols, cells, out.width))


def stop_table(run_id: str, results: dict[int, CmdResult], as_json: bool) -> None:
    data: dict[str, WorkerStopped] = {
        str(w): {
            "ok": r.ok,
            "detail": r.stdout.replace("tpuops: ", "").strip().replace("\n", "; ") or r.stderr.strip(),
        }
        for w, r in sorted(results.items())
    }
    if as_json:
        emit_json({"run_id": run_id, "workers": data})
        return
    for w, d in data.items():
        err.print(
            f"[cyan]\\[w{w}][/cyan] {'stopped' if d['ok'] else '[red]failed[/]'}: {escape(d['detail'])}"
        )


def doctor(found: Doctored, as_json: bool, vm: str | None = None) -> None:
    from tpuops.run import homesview

    health = found.workers
    if as_json:
        emit_json(
            [{**h.__dict__, "homes": [homesview.as_dict(x) for x in found.homes if x.worker == h.worker]}
             for h in health]
        )  # fmt: skip
        return
    keys = sorted({k for h in health for k in h.env_keys})
    ports = any(h.coordinator for h in health)
    # Addresses and lock states stay whole; a key's state and hash wrap onto two lines before anything is cut.
    cols = [Col("worker", "wrap"), Col("address"), Col("TPU lock", "wrap"),
            *([Col("coordinator port", "wrap")] if ports else []), *(Col(k, "wrap") for k in keys)]  # fmt: skip
    rows = []
    style = {
        "match": "green",
        "differs": "bold red",
        "missing": "bold yellow",
        "extra": "yellow",
        "unreadable": "bold red",
    }
    for h in health:
        who = f"w{h.worker}" if h.connected else f"[red]w{h.worker} not reached[/]"  # why: under the table
        cells = [
            f"[{style[h.env_keys[k]]}]{h.env_keys[k]}[/] {h.env_hashes.get(k, '')}" if k in h.env_keys else ""
            for k in keys
        ]
        port = [f"[{'green' if h.coordinator_ok else 'bold red'}]{escape(h.coordinator)}[/]"] if ports else []
        rows.append([who, escape(h.address), h.lock, *port, *cells])
    err.print(table_of(cols, rows, err.width, title=".env keys compared by hash (values never shown)"))
    for h in health:
        if not h.connected:
            err.print(f"[red]w{h.worker} not reached[/]: {escape(h.error or 'failed')}")
        elif not h.coordinator_ok:  # whole, under the table: a narrow terminal wraps the column
            err.print(f"[bold red]w{h.worker} coordinator port[/]: {escape(h.coordinator)}")
    if any(h.connected for h in health):
        homesview.doctor_homes(found.homes, vm)
    for fix in (f for h in health for f in h.fixes):
        err.print(f"[bold]fix[/]: {escape(fix)}")


def top_table(top: Top, as_json: bool) -> None:
    """`tpuops top`: one row per worker and chip (HBM in use, duty cycle), or why there are no memory fields."""
    from tpuops.run.logtext import chip_span

    if as_json:
        emit_json(top.to_dict())
        return
    rows: list[list[str]] = []
    for w in top.workers:
        c = w.chips or {}
        hbm, duty = c.get("hbm_gb_chips") or [], c.get("duty_pct_chips") or []
        span = chip_span(c, "hbm_gb", ".2f") or "-"
        common = [span, f"{c['hbm_gb_peak']:.2f}" if "hbm_gb_peak" in c else "-",
                  f"{c['hbm_gb_limit']:.2f}" if "hbm_gb_limit" in c else "-"]  # fmt: skip
        state = escape(w.state + (f" ({w.detail})" if w.detail else ""))
        step = "-" if w.step is None else str(w.step)
        for i in range(max(len(hbm), len(duty), 1)):
            rows.append([f"w{w.worker}", state if i == 0 else "", step if i == 0 else "",
                         str(i) if hbm or duty else "-", f"{hbm[i]:.2f}" if i < len(hbm) else "-",
                         f"{duty[i]:.1f}" if i < len(duty) else "-", *(common if i == 0 else ["", "", ""])])  # fmt: skip
    heads = ["worker", "job", "step", "chip", "HBM GB", "duty %", "HBM min-max GB", "peak GB", "limit GB"]
    err.print(grid(heads, rows, title=f"top {top.run_id}", title_justify="left"))
    if not top.memory_fields:
        from tpuops.run.top import NO_CHIPS

        err.print(escape(NO_CHIPS), highlight=False)
