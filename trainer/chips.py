"""Per-chip HBM in use and duty cycle of this process's local devices, for the step line (docs/trainer.md).

TPU: HBM from each device's `memory_stats()` (libtpu's allocator: bytes in use, peak, limit), duty cycle from
libtpu's monitoring SDK (`libtpu.sdk.tpumonitoring`, `duty_cycle_pct` per chip; HBM from its `hbm_capacity_usage`
/ `hbm_capacity_total` when memory_stats has none). GPU: `memory_stats()` (no duty cycle). CPU: nothing, so
the fields are absent from the line rather than zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

GB = 1e9


def _floats(values: Sequence[Any]) -> list[float]:
    out = []
    for v in values:
        try:
            out.append(float(str(v).strip().rstrip("%")))
        except ValueError:
            continue
    return out


def _monitoring(name: str) -> list[float]:
    """One metric of libtpu's monitoring SDK, per chip ([] where libtpu or the metric is missing)."""
    try:
        from libtpu.sdk import tpumonitoring  # untyped: pyproject.toml [tool.mypy] lists libtpu

        return _floats(tpumonitoring.get_metric(name).data())
    except Exception:
        return []


def fields(
    hbm_in_use: list[float], hbm_peak: list[float], hbm_limit: list[float], duty: list[float]
) -> dict[str, Any]:
    """The step line's chip fields from per-chip figures (bytes, percent); a kind with no figures is left out."""
    out: dict[str, Any] = {}
    if hbm_in_use:
        out["hbm_gb_min"] = min(hbm_in_use) / GB
        out["hbm_gb_max"] = max(hbm_in_use) / GB
        out["hbm_gb_chips"] = "/".join(f"{b / GB:.2f}" for b in hbm_in_use)
    if hbm_peak:
        out["hbm_gb_peak"] = max(hbm_peak) / GB
    if hbm_limit:
        out["hbm_gb_limit"] = min(hbm_limit) / GB
    if duty:
        out["duty_pct_min"] = min(duty)
        out["duty_pct_max"] = max(duty)
        out["duty_pct_chips"] = "/".join(f"{d:.1f}" for d in duty)
    return out


def sample(devices: Sequence[Any]) -> dict[str, Any]:
    """This process's chips now: {} on CPU (or where the backend exposes nothing)."""
    if not devices or devices[0].platform == "cpu":
        return {}
    stats = []
    for d in devices:
        try:
            stats.append(d.memory_stats() or {})
        except Exception:
            stats.append({})
    in_use = [float(s["bytes_in_use"]) for s in stats if "bytes_in_use" in s]
    peak = [float(s["peak_bytes_in_use"]) for s in stats if "peak_bytes_in_use" in s]
    limit = [float(s["bytes_limit"]) for s in stats if "bytes_limit" in s]
    duty: list[float] = []
    if devices[0].platform == "tpu":
        duty = _monitoring("duty_cycle_pct")
        if not in_use:
            in_use, limit = _monitoring("hbm_capacity_usage"), _monitoring("hbm_capacity_total")
    return fields(in_use, peak, limit, duty)
