"""The step time this trainer has shown on real accelerators: the fit's bound per phase divided by the efficiency
measured there (decode: share of HBM bandwidth; update and the other training-like phases: MFU).

Measurements are JSON records in the checkout's `bench/results/` (one object per file; FIELDS below); the package
ships a copy (`tpuops/checks/data/results/`, a test holds it equal to `bench/results/`), so an install without a
checkout is calibrated the same way. tpuops never imports the trainer. Without records the published efficiencies
stay the basis, and the answer says so. When a TPU record exists, TPU records are the basis; otherwise the GPU ones.
The range spans the efficiencies of the records on that basis; the newest is named first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict, cast

from tpuops.checks.fit import FitResult

RESULTS = Path("bench") / "results"
# Every field the calibration reads from a record (a test holds each recorded file to it).
# trainer.fit's phases by kind (trainer/fit/estimate.py PHASE_KIND): the decode loops are HBM-bound, the rest
# (prefill, ref_logp, update) are training-like programs judged by MFU.
DECODE_PHASES = ("decode_cast", "decode")
Efficiency = Literal["decode_mbu", "update_mfu"]


class Measured(TypedDict):
    """The fields of a `bench/results/` record the calibration reads (FIELDS): what `bench/results_record.py`
    writes at least."""

    card: str
    platform: str  # "tpu" or "gpu"
    date: str
    commit: str
    config: str
    new_tokens: int
    step_s: float
    bound_s: float
    decode_mbu: float  # the decode loop's share of HBM bandwidth
    update_mfu: float  # the update's model FLOPs utilisation


FIELDS = tuple(Measured.__annotations__)  # what a record must hold to be read


class Record(Measured):
    """One measurement as the calibration holds it (a file may carry more, which it does not read) and the
    file it came from."""

    file: str


class BasisDict(TypedDict):
    records: list[Record]
    decode_mbu: list[float]  # [lowest, highest]
    update_mfu: list[float]


class Calibrated(TypedDict):
    expected_s: list[float]  # [low, high]
    expected_mid_s: float
    basis: BasisDict


@dataclass(frozen=True)
class Basis:
    """The records a calibrated range is made from: newest first, all on one platform."""

    records: tuple[Record, ...]

    def span(self, key: Efficiency) -> tuple[float, float]:
        values = [float(r[key]) for r in self.records]
        return min(values), max(values)

    def words(self) -> str:
        """`H200 2026-11-28, H100 2026-11-27: decode 23-25% of HBM bandwidth, update 24-27% MFU`."""
        runs = ", ".join(f"{r['card']} {r['date']}" for r in self.records)
        d, u = self.span("decode_mbu"), self.span("update_mfu")
        pct = lambda lo, hi: f"{lo:.0%}" if round(lo, 2) == round(hi, 2) else f"{lo * 100:.0f}-{hi:.0%}"  # noqa: E731
        return f"{runs}: decode {pct(*d)} of HBM bandwidth, update {pct(*u)} MFU"

    def to_dict(self) -> BasisDict:
        keep = (*FIELDS, "file")
        return {
            "records": [cast(Record, {k: v for k, v in r.items() if k in keep}) for r in self.records],
            "decode_mbu": list(self.span("decode_mbu")), "update_mfu": list(self.span("update_mfu")),
        }  # fmt: skip


def shipped() -> Path | None:
    """The records shipped with tpuops (package data, read through importlib.resources)."""
    from importlib import resources

    root = resources.files("tpuops") / "checks" / "data" / "results"
    return root if isinstance(root, Path) and root.is_dir() else None


def find_results(start: Path, fallback: Path | None = None) -> Path | None:
    """The `bench/results` folder of the checkout `start` is in (start or a parent), else `fallback` (the copy
    shipped with tpuops)."""
    for d in (start, *start.parents):
        if (d / RESULTS).is_dir():
            return d / RESULTS
    return fallback


def load(results: Path | None) -> list[Record]:
    """The records of a results folder (each with `file`); a file without every FIELD is left out."""
    out: list[Record] = []
    for f in sorted(results.glob("*.json")) if results else []:
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and all(k in rec for k in FIELDS):
            out.append(cast(Record, {**rec, "file": f.name}))
    return out


def basis(records: list[Record]) -> Basis | None:
    """TPU records when there are any, else GPU ones; newest first. None without records. A CPU record (the bench's
    check of itself, `DEVICE_STEP_SIZES=tiny`) measures no accelerator and is never a basis."""
    tpu = [r for r in records if str(r["platform"]).lower() == "tpu"]
    chosen = tpu or [r for r in records if str(r["platform"]).lower() == "gpu"]
    if not chosen:
        return None
    return Basis(tuple(sorted(chosen, key=lambda r: str(r["date"]), reverse=True)))


def calibrated(estimate: Mapping[str, object], b: Basis) -> Calibrated:
    """The expected step at the measured efficiencies: each phase's bound / the efficiency of its kind (the
    best measured efficiency gives the low end), plus the host's work. `estimate`: trainer.fit's, with
    `phases_s` (phase -> seconds at its bound) and `host_s`."""
    phases = cast(dict[str, float], estimate["phases_s"])
    d, u = b.span("decode_mbu"), b.span("update_mfu")
    host = float(cast(float, estimate.get("host_s", 0.0)))

    def at(i: int) -> float:
        return host + sum(s / (d if name in DECODE_PHASES else u)[i] for name, s in phases.items())

    low, high = at(1), at(0)
    return {"expected_s": [low, high], "expected_mid_s": (low + high) / 2, "basis": b.to_dict()}


def calibrate(
    result: FitResult, efficiency: str = "measured", cwd: Path | None = None, *, packaged: bool = True
) -> FitResult:
    """The fit result with `estimate.calibrated` (the range at measured efficiencies and its basis) and
    `estimate.basis_line`; `efficiency="published"` (or no records) keeps the published range as the step."""
    est = dict(result["estimate"])
    published = est.get("expected_s")
    pub = f"{published[0]:.2f}-{published[1]:.2f} s at published efficiencies" if published else ""
    found = find_results(cwd or Path.cwd(), shipped() if packaged else None)
    b = basis(load(found)) if efficiency == "measured" else None
    if b is None or "phases_s" not in est:
        why = ("--efficiency published" if efficiency != "measured"
               else "no accelerator results recorded here (bench/results/)")  # fmt: skip
        est["calibrated"] = None
        est["basis_line"] = f"expected {pub} ({why})" if pub else ""
        return {**result, "estimate": est}
    cal = calibrated(est, b)
    low, high = cal["expected_s"]
    est["calibrated"] = cal
    est["basis_line"] = (f"expected {low:.2f}-{high:.2f} s at this trainer's measured efficiency ({b.words()})"
                         + (f"; {pub}" if pub else ""))  # fmt: skip
    return {**result, "estimate": est}
