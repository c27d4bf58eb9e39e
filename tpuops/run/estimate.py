"""A run against its fit: estimated and actual cost (steps x measured step time x the price the fit used), and
measured peak HBM beside the fit's predicted peak, with a warning when the run used more than predicted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

from tpuops.logs.events import LogReport

GB = 1e9


class UnitPrice(TypedDict):
    """The price per chip-hour a cost was made with (the fields of cloud/pricing's `Price.to_dict` read here)."""

    on_demand: float
    spot: float | None
    source: str
    date: str


class Dollars(TypedDict):
    on_demand: float | None
    spot: float | None


class FitCost(TypedDict):
    """The fit's cost of a run (cloud/pricing's `cost()`), as far as the comparison reads it."""

    chips: int
    steps: int | None
    step_s: float
    per_run: Dollars | None
    price: UnitPrice


class Estimate(TypedDict, total=False):
    """What a VM run's fit preflight saved (run/prepare.fit_preflight; run.json and result.json): the config and
    accelerator it was made for, the cost, and the predicted peak HBM per device and its phase."""

    config: str
    accelerator: str
    cost: FitCost | None
    peak_bytes: float | None
    tightest_phase: str


class Figures(TypedDict):
    steps: int | None
    step_s: float
    on_demand: float | None
    spot: float | None


class CostAgainst(TypedDict):
    estimated: Figures
    actual: Figures
    price: UnitPrice
    chips: int
    estimated_run_s: float
    actual_run_s: float


class HbmAgainst(TypedDict):
    predicted_gb: float
    measured_gb: float
    over: bool
    phase: str | None


class Against(TypedDict):
    """A run against its fit (`compare`): each part only where both sides exist."""

    cost: CostAgainst | None
    hbm: HbmAgainst | None
    warnings: list[str]


def saved(target: str, runs_home: Path | None = None) -> Estimate | None:
    """The fit estimate a VM run's preflight saved (run.json, and result.json), for a run id or run folder."""
    path = Path(target).expanduser()
    if not path.is_dir():
        if runs_home is None:
            from tpuops.config import state_home

            runs_home = state_home() / "runs"
        path = runs_home / target
    for name in ("result.json", "run.json"):  # a detached run has no result yet
        try:
            # As fit_preflight wrote it.
            est: Estimate | None = json.loads((path / name).read_text()).get("estimate")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(est, dict):
            return est
    return None


def compare(estimate: Estimate | None, log: LogReport) -> Against:
    """{"cost": {estimated, actual} | None, "hbm": {predicted_gb, measured_gb, over} | None, "warnings": [...]}:
    each part only where both sides exist."""
    out: Against = {"cost": None, "hbm": None, "warnings": []}
    est: Estimate = estimate or {}
    cost = est.get("cost")
    if isinstance(cost, dict) and log.steps and log.dt is not None:
        price, chips = cost["price"], cost["chips"]
        run_s = log.steps * log.dt.mean  # every step at the steady mean (the warm-up's compile is not priced)

        def money(per_hour: float | None) -> float | None:
            return None if per_hour is None else round(run_s / 3600 * chips * per_hour, 6)

        estimated_s = (cost["steps"] or log.steps) * cost["step_s"]
        per_run = cost.get("per_run")
        out["cost"] = {
            "estimated": {"steps": cost["steps"], "step_s": cost["step_s"],
                          "on_demand": per_run["on_demand"] if per_run else None,
                          "spot": per_run["spot"] if per_run else None},
            "actual": {"steps": log.steps, "step_s": log.dt.mean, "on_demand": money(price["on_demand"]),
                       "spot": money(price.get("spot"))},
            "price": price, "chips": chips, "estimated_run_s": estimated_s, "actual_run_s": run_s,
        }  # fmt: skip
    predicted, measured = est.get("peak_bytes"), log.hbm_peak_gb
    if isinstance(predicted, int | float) and measured is not None:
        over = measured * GB > predicted
        out["hbm"] = {"predicted_gb": predicted / GB, "measured_gb": measured, "over": over,
                      "phase": est.get("tightest_phase")}  # fmt: skip
        if over:
            out["warnings"].append(
                f"HBM: the run used {measured:.2f} GB on a chip, more than the fit predicted ({predicted / GB:.2f} GB, "
                f"{est.get('tightest_phase')}): the fit's headroom is smaller than it said"
            )
    return out


def lines(cmp: Against) -> list[str]:
    """The comparison as people read it (the report's text)."""
    from tpuops.cloud.pricing import dollars

    out = []
    if c := cmp.get("cost"):
        e, a = c["estimated"], c["actual"]
        out.append(f"cost: estimated {dollars(e['on_demand'])} on demand / {dollars(e['spot'])} Spot for {e['steps']} "
                   f"steps at {e['step_s']:.2f} s; actual {dollars(a['on_demand'])} / {dollars(a['spot'])} for "
                   f"{a['steps']} steps at {a['step_s']:.2f} s measured ({c['chips']} chips at "
                   f"${c['price']['on_demand']:.2f}/chip-hour, {c['price']['source']} {c['price']['date']})")  # fmt: skip
    if h := cmp.get("hbm"):
        out.append(f"HBM: measured peak {h['measured_gb']:.2f} GB per chip, fit predicted {h['predicted_gb']:.2f} GB "
                   f"({h['phase']})" + (" - MORE than predicted" if h["over"] else ""))  # fmt: skip
    return out
