"""What a LogReport says in words, for the text report (logreport.py) and the page (htmlpage.py) alike: its exit
code, each worker's chips, whether compiles were logged."""

from __future__ import annotations

from collections.abc import Mapping

from tpuops.errors import ExitCode
from tpuops.logs.events import LogReport
from tpuops.run.baseline import Delta


def exit_code(report: LogReport, deltas: list[Delta] | None = None) -> int:
    """1 on failure signatures or a baseline regression, 7 on compiles after the warm-up, else 0."""
    if report.failed or any(d.regressed for d in deltas or []):
        return int(ExitCode.FAILED)
    if report.recompiled:
        return int(ExitCode.RECOMPILE)
    return int(ExitCode.OK)


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


def chip_span(sample: Mapping[str, object], prefix: str, fmt: str) -> str:
    """`min-max` of a chip sample's `PREFIX_min`/`PREFIX_max`, whichever of them it has ("" for neither): a
    step line may carry any of its optional fields."""
    found = [
        format(v, fmt) for k in ("min", "max") if isinstance(v := sample.get(f"{prefix}_{k}"), int | float)
    ]
    return "-".join(found)


NOT_LOGGED = (
    "not logged (JAX compile logging was off; `tpuops recompile-check`, --set compile_log=true for the bundled "
    "trainer, or JAX_LOG_COMPILES=1 for any JAX program turns it on)"
)

NOT_SEEN = "not logged (no JAX compile line was seen; the fix line below says what may hide them)"


def compiles_logged(report: LogReport) -> bool:
    """With logging on, step 0 always compiles: no compile at all in a run with steps means it was off."""
    return report.compiles.get("total", 0) > 0 or not report.steps


def cache_line(report: LogReport) -> str | None:
    """What JAX's persistent compilation cache gave the run, as its log says (None: the log does not say)."""
    c = report.compile_cache
    if c is None:
        return None
    if c.get("off"):
        return "compile cache: off (every program was compiled)"
    saved = c.get("saved_s")
    tail = f", {saved:.1f}s of compiling saved" if isinstance(saved, int | float) else ""
    n = c["hits"]
    return f"compile cache: {n} program{'s' if n != 1 else ''} from the persistent cache{tail}"
