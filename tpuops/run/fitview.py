"""`tpuops fit`'s people's view on stderr: the phases' table (one table on a wide terminal, two on a narrow one,
every number whole), the step's bound and expected ranges with their basis, the verdict and the cost."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, SupportsFloat

from tpuops.console import emit_json, err, escape, grid

if TYPE_CHECKING:  # built by console.py's helpers
    from rich.table import Table

MEMORY = ("arguments", "outputs", "temp", "resident", "peak", "headroom")
TIME = ("TFLOP", "HBM GB", "collective GB", "bound s", "expected s", "largest")


def _cells(result: dict[str, Any]) -> list[dict[str, str]]:
    from tpuops.checks.fit import GB

    rows = []
    for name, p in result["phases"].items():
        gb = {
            k: f"{p[k] / GB:.2f}" for k in ("argument_bytes", "output_bytes", "temp_bytes", "resident_bytes")
        }
        rows.append({
            "phase": name, "arguments": gb["argument_bytes"], "outputs": gb["output_bytes"], "temp": gb["temp_bytes"],
            "resident": gb["resident_bytes"], "peak": f"{p['peak_bytes'] / GB:.2f}",
            "headroom": f"[{'green' if p['fits'] else 'bold red'}]{p['headroom']:.0%}[/]",
            "TFLOP": f"{p['flops'] / 1e12:.2f}", "HBM GB": f"{p.get('hbm_bytes', p['bytes_accessed']) / GB:.2f}",
            "collective GB": f"{p['collective_bytes']['moved'] / GB:.2f}", "bound s": f"{p['seconds']:.3f}",
            "expected s": "-".join(f"{s:.2f}" for s in p.get("expected_s", [p["seconds"]] * 2)),
            "largest": p["largest_term"],
        })  # fmt: skip
    return rows


def _number(o: object) -> float:
    """A value json cannot write (a numpy scalar) as the float it is; anything else json refuses, as float would."""
    if isinstance(o, SupportsFloat):
        return float(o)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _visible(cell: str) -> int:
    return len(cell.split("]", 1)[1].rsplit("[/]", 1)[0]) if cell.startswith("[") else len(cell)


def _table(rows: list[dict[str, str]], columns: tuple[str, ...], title: str | None) -> Table:
    from rich import box
    from rich.table import Column

    # Numbers never wrap or shrink: the column is at least as wide as its widest cell (a header may wrap).
    heads = [
        Column(c, no_wrap=True, min_width=max(_visible(r[c]) for r in rows) if rows else len(c),
               justify="left" if c in ("phase", "largest") else "right")
        for c in ("phase", *columns)
    ]  # fmt: skip
    cells = [[r[c] for c in ("phase", *columns)] for r in rows]
    return grid(heads, cells, title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                collapse_padding=True)  # fmt: skip


def _width(rows: list[dict[str, str]], columns: tuple[str, ...]) -> int:
    """Characters one table of these columns needs with every header and cell on one line."""
    return sum(max(len(c), *(_visible(r[c]) for r in rows)) + 2 for c in ("phase", *columns))


def fit_report(result: dict[str, Any], as_json: bool) -> None:
    """`tpuops fit`: per phase the per-device bytes and headroom, FLOPs, bytes moved and estimated seconds."""
    from tpuops.checks.fit import GB, cached_words, summary

    if as_json:
        emit_json(result, default=_number)
    title = (
        f"{result['config']} on {result['accelerator']} ({result['topology']}: {result['devices']} x "
        f"{result['device_kind']}, {result['hbm_bytes_per_device'] / GB:.1f} GB HBM each) - loss {result['impl']}, "
        f"mesh {result['mesh']}, rollout mesh {result['rollout_mesh']}, {result['method']}"
    )
    if (once := result.get("prompt_once_per", 1)) > 1:  # train.shared_prompt applied to the update
        title += f"; update runs each prompt once per group of {once}"
    rows = _cells(result)
    if _width(rows, MEMORY + TIME) <= err.width:
        err.print(_table(rows, MEMORY + TIME, escape(title)))
    else:  # a narrow terminal: memory, then time, each with every number whole
        err.print(escape(title), highlight=False)
        err.print(_table(rows, MEMORY, "memory per device (GB)"))
        err.print(_table(rows, TIME, "work and time per step"))
    _estimate(result["estimate"])
    if dcn := result.get("dcn"):
        err.print(
            f"DCN ({dcn['slices']} slices): {dcn['bytes_per_device'] / GB:.3f} GB per device, "
            f"{dcn['bytes_per_host'] / GB:.3f} GB per host per step, {dcn['seconds']:.3f} s at "
            f"{dcn['bandwidth_per_host'] / 1e9:.0f} GB/s per host; "
            + ("[bold red]dominates[/]: longer than the step's bound" if dcn["dominates"]
               else f"under the step's bound of {dcn['step_bound_s']:.3f} s")
        )  # fmt: skip
    style = "green" if result["fits"] else "bold red"
    err.print(f"[{style}]{escape(summary(result))}[/]" + escape(cached_words(result, None)))
    if result.get("cost"):
        from tpuops.cloud.pricing import cost_line

        err.print(escape(cost_line(result["cost"])), highlight=False)
    elif unpriced := result.get("unpriced"):
        from tpuops.cloud.price_table import Unpriced

        near = tuple((n["region"], n["on_demand_per_chip"]) for n in unpriced["nearest"])
        u = Unpriced(unpriced["accelerator"], unpriced["region"], unpriced["reason"], near)
        err.print(escape(f"cost: no price: {u.line()}"), highlight=False)


def _estimate(est: dict[str, Any]) -> None:
    if "expected_s" not in est:  # a verdict cached before the expected range
        err.print(f"estimate: {est['step_s']:.2f} s per step at 100% of the roofline (a lower bound, not a promise); "
                  f"largest phase: {est['largest_phase']}")  # fmt: skip
        return
    device = est["bound_s"] - est["host_s"]
    err.print(f"bound: {est['bound_s']:.2f} s per step (device {device:.3f} s: every op at 100% of its roofline, "
              "collectives over the links they use + 1 us per hop, overlapped only as libtpu scheduled them; host "
              f"work {est['host_s']:.2f} s; not a promise); largest phase: {est['largest_phase']}")  # fmt: skip
    if est.get("basis_line"):
        err.print(escape(est["basis_line"]), highlight=False)
    else:
        low, high = est["expected_s"]
        err.print(f"expected: {low:.2f}-{high:.2f} s per step at published efficiencies")
    for kind, e in est["efficiency"].items():
        err.print(
            f"  published {kind}: {e['low']:.0%}-{e['high']:.0%} of the roofline, {escape(e['source'])}"
        )
