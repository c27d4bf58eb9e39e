"""The TPU price table shipped with tpuops (`data/tpu_prices.json`, built from SkyPilot's public GCP catalog by
scripts/update_prices.py): a slice's price per region, on demand and Spot, and where a type is not offered.

A region the catalog does not offer a type in gets no price: never another region's price under its name. The
answer then names the nearest regions that do offer it (by the great-circle distance between the cities the
regions are named after, `data/regions.json`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import NotRequired, TypedDict, cast

from tpuops.cloud import accelerators

_ZONE = re.compile(r"[a-z]+-[a-z]+\d+-[a-z]")


class PriceRow(TypedDict):
    """One slice type in one region: USD per slice-hour and per chip-hour, and the zones that offer it."""

    on_demand: float
    spot: float | None
    on_demand_per_chip: float
    spot_per_chip: float | None
    zones: list[str]


class SliceEntry(TypedDict):
    chips: int
    regions: dict[str, PriceRow]
    not_offered: list[str]


class FamilyEntry(TypedDict):
    catalog_name: str
    slices: dict[str, SliceEntry]  # slice size ("8") -> its entry


class Source(TypedDict):
    name: str
    repository: str
    path: str
    commit: str
    date: str
    date_is: NotRequired[str]


class PriceTable(TypedDict):
    """data/tpu_prices.json."""

    source: Source
    unit: str
    families: dict[str, FamilyEntry]


class NearRegion(TypedDict):
    region: str
    on_demand_per_chip: float


class UnpricedDict(TypedDict):
    accelerator: str
    region: str
    reason: str
    nearest: list[NearRegion]
    source: Source


@dataclass(frozen=True)
class Unpriced:
    """Why a type has no price in a region, and the nearest regions that price it (region, USD per chip-hour)."""

    accelerator: str
    region: str
    reason: str
    nearest: tuple[tuple[str, float], ...] = ()

    def line(self) -> str:
        near = ", ".join(f"{r} (${p:.2f}/chip-hour)" for r, p in self.nearest)
        return f"{self.reason}" + (f"; nearest regions that offer it: {near}" if near else "")

    def to_dict(self) -> UnpricedDict:
        return {
            "accelerator": self.accelerator, "region": self.region, "reason": self.reason,
            "nearest": [{"region": r, "on_demand_per_chip": p} for r, p in self.nearest], "source": source(),
        }  # fmt: skip


def region_of(zone: str) -> str:
    """`us-east5-b` -> `us-east5` (a region passes through)."""
    return zone.rsplit("-", 1)[0] if _ZONE.fullmatch(zone) else zone


@cache
def table() -> PriceTable:
    """The shipped price table (package data)."""
    return cast(
        PriceTable, json.loads(resources.files("tpuops.cloud").joinpath("data/tpu_prices.json").read_text())
    )


@cache
def _coords() -> dict[str, tuple[float, float]]:
    raw = json.loads(resources.files("tpuops.cloud").joinpath("data/regions.json").read_text())
    return {k: (float(v[0]), float(v[1])) for k, v in raw["regions"].items()}


def source() -> Source:
    """The table's source: catalog name, repository, path, commit and date."""
    return table()["source"].copy()


def label() -> str:
    """`SkyPilot catalog 017e2502, 2026-11-29`."""
    s = source()
    return f"{s['name']} {s['commit'][:8]}, {s['date']}"


def _km(a: str, b: str) -> float:
    coords = _coords()
    if a not in coords or b not in coords:
        return math.inf
    (la1, lo1), (la2, lo2) = (tuple(map(math.radians, coords[x])) for x in (a, b))
    h = math.sin((la2 - la1) / 2) ** 2 + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    return 2 * 6371 * math.asin(math.sqrt(h))


def slice_entry(accelerator_type: str) -> SliceEntry | None:
    """The table's entry for one slice type (chips, regions, not_offered), None when the catalog lists none."""
    fam = table()["families"].get(accelerators.family(accelerator_type))
    if fam is None:
        return None
    return fam["slices"].get(accelerator_type.rsplit("-", 1)[1])


def nearest(accelerator_type: str, region: str, n: int = 3) -> tuple[tuple[str, float], ...]:
    """Up to `n` regions that offer the type, nearest `region` first (alphabetical when its place is unknown)."""
    entry = slice_entry(accelerator_type)
    if entry is None:
        return ()
    offered = sorted(entry["regions"], key=lambda r: (_km(region, r), r))
    return tuple((r, float(entry["regions"][r]["on_demand_per_chip"])) for r in offered[:n])


def price_in(accelerator_type: str, region: str) -> PriceRow | Unpriced:
    """The table's row for the type in `region` (a zone is read as its region): on_demand, spot (per slice-hour),
    on_demand_per_chip, spot_per_chip, zones; or why there is none."""
    region = region_of(region)
    src = table()["source"]
    entry = slice_entry(accelerator_type)
    fam = accelerators.family(accelerator_type)
    if entry is None:
        if fam not in table()["families"]:
            why = (
                f"{fam} has no public price in the catalog ({src['name']} {src['commit'][:8]}, {src['date']})"
            )
        else:
            why = f"the catalog ({label()}) lists no {accelerator_type} slice"
        return Unpriced(accelerator_type, region, why)
    row = entry["regions"].get(region)
    if row is None:
        return Unpriced(accelerator_type, region, f"{accelerator_type} is not offered in {region} ({label()})",
                        nearest(accelerator_type, region))  # fmt: skip
    return row.copy()
