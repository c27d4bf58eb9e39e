"""`train.remat: auto` for a TPU compile: the update compiled per remat candidate, most activations kept first, until
one fits in 90% of the device's HBM (trainer.loop.remat.pick), or of what libtpu says it can allocate once a
candidate's compile has named it (`allocatable`); the winner's measurement is the update's phase."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from trainer import config
from trainer.config import Config
from trainer.fit import analyze, estimate, programs
from trainer.loop.remat import ORDER, pick

_AVAILABLE = re.compile(r"available HBM \((?P<gib>[0-9.]+)G\)")


def allocatable(error: str) -> int | None:
    """The HBM libtpu lets a program allocate per device, as its RESOURCE_EXHAUSTED message names it ("exceeds
    available HBM (31.25G)", GiB: a v6e's 32 GiB less what libtpu keeps), or None. A run's `remat: auto` measures
    against its device's allocator limit (trainer.loop.remat.device_memory), which is libtpu's figure too, not the
    chip's: a candidate within 90% of the chip's HBM but not of this would not be the run's choice."""
    m = _AVAILABLE.search(error)
    return int(float(m["gib"]) * 2**30) if m else None


def resolve(
    cfg: Config,
    devices: list[Any],
    per_device: dict[str, float],
    geo: estimate.Geometry,
    breakdown: int = 0,
) -> tuple[Config, dict[str, Any], dict[str, Any]]:
    """(cfg at the chosen policy, the winner's raw update measurement (analyze.measure), the choice as
    {"policy", "why", "peaks"}). Each candidate is lowered and compiled once; the winner is not compiled again."""
    peaks: dict[str, int | None] = {}
    raws: dict[str, dict[str, Any]] = {}
    hbm = int(per_device["hbm_bytes"])
    while (choice := pick(peaks, hbm, analyze.HEADROOM)) is None:
        policy = ORDER[len(peaks)]
        candidate = config.with_sets(cfg, [f"train.remat={policy}"])
        progs, _ = programs.step_programs(candidate, devices, ("update",))
        raw = analyze.measure(progs[0], len(devices), breakdown, per_device, geo)
        raws[policy] = raw
        peaks[policy] = None if "error" in raw else int(analyze.verdict(raw, per_device)["peak_bytes"])
        hbm = min(hbm, allocatable(raw.get("error", "")) or hbm)
    return config.with_sets(cfg, [f"train.remat={choice.policy}"]), raws[choice.policy], asdict(choice)
