"""`train.remat: auto` for a TPU compile: the update compiled per remat candidate, most activations kept first, until
one fits in 90% of the device's HBM (trainer.loop.remat.pick); the winner's measurement is the update's phase."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from trainer import config
from trainer.config import Config
from trainer.fit import analyze, estimate, programs
from trainer.loop.remat import ORDER, pick


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
    return config.with_sets(cfg, [f"train.remat={choice.policy}"]), raws[choice.policy], asdict(choice)
