"""Benchmarks as people read them: `tpuops bench`'s rollout comparison, and the `metrics:` lines of gradcheck and
microbench jobs as tables (their --json is the run's own)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tpuops.console import emit_json, err, escape, grid, id_column

if TYPE_CHECKING:  # the renderers' inputs and outputs, named for the type checker
    from rich.table import Table

    from tpuops.run.bench import VariantResult

Metrics = dict[str, object]  # one `metrics: {json}` line of the log, as parsed


def rollout_bench(results: list[VariantResult], as_json: bool) -> None:
    """`tpuops bench`: each variant's steady-state step and phase times, and their ratios to the first."""
    base = results[0]

    def ratio(v: float | None, b: float | None) -> str:
        return "" if v is None or not b else f"{v / b:.2f}x"

    if as_json:
        rows = [
            {
                **r.__dict__,
                "dt_p50_ratio": None if r.dt_p50 is None or not base.dt_p50 else r.dt_p50 / base.dt_p50,
                "rollout_ratio": None
                if r.rollout_generate_mean is None or not base.rollout_generate_mean
                else r.rollout_generate_mean / base.rollout_generate_mean,
            }
            for r in results
        ]
        emit_json(rows)
        return
    from rich.table import Column

    profiled = any(r.top_ops or r.profile_note for r in results)
    heads: list[str | Column] = [
        "variant",
        "steps",
        "dt p50 s",
        "ratio",
        "rollout_generate s",
        "ratio",
        "update s",
    ]
    if profiled:  # --profile: each variant's top ops over the traced steps (their own time's share)
        heads.append(Column("top ops (share)", overflow="fold"))
    heads.append(id_column("run", [r.run_id for r in results]))
    cells: list[list[str]] = []
    for r in results:
        f = lambda v: "" if v is None else f"{v:.3f}"  # noqa: E731
        ops = ", ".join(f"{o['name']} {o['share']:.0%}" for o in r.top_ops) or (r.profile_note or "")
        cells.append([
            r.label, str(r.steps), f(r.dt_p50), ratio(r.dt_p50, base.dt_p50), f(r.rollout_generate_mean),
            ratio(r.rollout_generate_mean, base.rollout_generate_mean), f(r.update_mean),
            *([escape(ops)] if profiled else []), r.run_id,
        ])  # fmt: skip
    err.print(
        grid(heads, cells, title="rollout comparison (steady state, after warm-up)", title_justify="left")
    )


def metrics_table(m: Metrics) -> Table:
    """A `metrics: {json}` line from gradcheck as a table (other kinds but microbench: key/value rows)."""
    if m.get("kind") == "gradcheck":
        impls = _dicts(m.get("impls"))
        quantities = sorted({q for r in impls.values() for q in r if isinstance(r.get(q), dict)})
        title = (
            f"gradcheck {m.get('loss')} ({m.get('config')}, {m.get('dtype')}, {m.get('backend')}), "
            f"tolerance rel {m.get('tolerance_rel')}"
        )
        rows = [
            [impl, *(f"{_rel(r[q]):.1e}" if q in r else "" for q in quantities),
             "[green]yes[/]" if r.get("ok") else "[bold red]NO[/]"]
            for impl, r in impls.items()
        ]  # fmt: skip
        return grid(
            ["impl", *[f"{q} rel" for q in quantities], "ok"], rows, title=title, title_justify="left"
        )
    rows = [[str(k), escape(json.dumps(v) if isinstance(v, dict | list) else str(v))] for k, v in m.items()]
    return grid(["key", "value"], rows, title=str(m.get("kind", "metrics")), title_justify="left")


def _dicts(v: object) -> dict[str, dict[str, object]]:
    """A JSON object of objects (gradcheck's `impls`), anything else as empty."""
    if not isinstance(v, dict):
        return {}
    return {str(k): x for k, x in v.items() if isinstance(x, dict)}


def _rel(v: object) -> float:
    """A gradcheck quantity's relative error (`{"rel": ...}`)."""
    rel = v.get("rel") if isinstance(v, dict) else None
    return float(rel) if isinstance(rel, int | float) else float("nan")


def microbench_table(ms: list[Metrics]) -> Table:
    """`metrics:` lines of microbench runs side by side; ratios against the first implementation."""
    first = _number(ms[0].get("p50_ms"))

    def mb(v: object) -> str:
        return "" if v is None else f"{_number(v) / 1e6:.1f}"

    rows = []
    for m in ms:
        p50 = _number(m.get("p50_ms"))
        rows.append([
            str(m.get("impl")), f"{m.get('B')}×{m.get('T')}×{m.get('V')}", str(m.get("dtype")),
            f"{_number(m.get('mean_ms')):.2f}", f"{p50:.2f}", f"{_number(m.get('p90_ms')):.2f}",
            f"{p50 / first:.2f}×" if first > 0 else "", mb(m.get("temp_bytes")), mb(m.get("peak_bytes")),
            str(m.get("backend")),
        ])  # fmt: skip
    heads = [
        "impl",
        "B×T×V",
        "dtype",
        "mean ms",
        "p50 ms",
        "p90 ms",
        "p50 ratio",
        "temp MB",
        "peak MB",
        "backend",
    ]
    title = "microbench (forward+backward; ratio: p50 against the first row)"
    return grid(heads, rows, title=title, title_justify="left")


def _number(v: object) -> float:
    """A JSON number as a float; missing (or not a number) as 0."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        return 0.0
    try:
        return float(v or 0)
    except ValueError:
        return 0.0
