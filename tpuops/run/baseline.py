"""Comparing a LogReport with a saved baseline: which steady-state metrics got worse, and by how much."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tpuops.logs.events import LogReport

# Baseline metrics: (dotted key in to_dict(), +1 if higher is worse, -1 if lower is worse).
BASELINE_KEYS: tuple[tuple[str, int], ...] = (
    ("dt.mean", 1),
    ("dt.p50", 1),
    ("dt.p90", 1),
    ("rollout_generate_mean", 1),
    ("update_mean", 1),
    ("tokens_per_s_mean", -1),
)


@dataclass
class Delta:
    metric: str
    baseline: float
    current: float
    change: float  # relative, signed: + is worse
    regressed: bool


def _get(data: object, dotted: str) -> float | None:
    cur = data
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return float(cur) if isinstance(cur, int | float) else None


def compare(report: LogReport, baseline: Mapping[str, object], threshold: float = 0.1) -> list[Delta]:
    """Relative change of each metric both reports have; regressed when worse by more than `threshold`."""
    base = baseline.get("report", baseline)  # accepts the --json output or a bare to_dict()
    now = report.to_dict()
    deltas = []
    for key, sign in BASELINE_KEYS:
        b, c = _get(base, key), _get(now, key)
        if b is None or c is None or b == 0:
            continue
        change = sign * (c - b) / abs(b)
        deltas.append(Delta(key, b, c, change, change > threshold))
    return deltas
