"""Regenerate tpuops/cloud/data/tpu_prices.json from SkyPilot's public GCP catalog (one command per update).

    git clone https://github.com/skypilot-org/skypilot-catalog /tmp/skypilot-catalog
    python scripts/update_prices.py /tmp/skypilot-catalog/catalogs/v7/gcp/vms.csv \\
        --commit "$(git -C /tmp/skypilot-catalog rev-parse HEAD)" \\
        --date "$(git -C /tmp/skypilot-catalog log -1 --format=%cs)"

Every TPU row of the CSV (`tpu-v6e-8`, `tpu-v5p-128`, ...: the price of the whole slice per hour, on demand and
Spot, per zone) becomes, per family, slice size and region: the slice's price per hour, its price per chip-hour
and the zones the catalog lists. A price of 700.0 is the catalog's marker for a type not offered in a region:
such a region is listed under `not_offered`, never priced. Zones of one region must agree on a price (the
script stops and names the row when they do not).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import TypedDict

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tpuops.cloud import accelerators  # noqa: E402  (the repository's own package, found through REPO)

NOT_OFFERED = 700.0  # the catalog's placeholder price for a type a region does not offer
CATALOG = "https://github.com/skypilot-org/skypilot-catalog"
CSV_PATH = "catalogs/v7/gcp/vms.csv"
OUT = REPO / "tpuops" / "cloud" / "data" / "tpu_prices.json"


class RegionPrice(TypedDict):
    on_demand: float
    spot: float | None
    on_demand_per_chip: float
    spot_per_chip: float | None
    zones: list[str]


def _money(text: str) -> float | None:
    return float(text) if text.strip() else None


def build(rows: list[dict[str, str]], commit: str, date: str, date_is: str) -> dict[str, object]:
    """The table: family -> size -> {chips, regions: {region: RegionPrice}, not_offered: [region]}."""
    families: dict[str, dict[str, dict[str, object]]] = {}
    names: dict[str, str] = {}
    for row in rows:
        name = row["AcceleratorName"]
        if not name.startswith("tpu-"):
            continue
        acc = name.removeprefix("tpu-")
        fam, size = accelerators.family(acc), acc.rsplit("-", 1)[1]
        names[fam] = acc.rsplit("-", 1)[0]
        chips = accelerators.chips(acc)
        entry = families.setdefault(fam, {}).setdefault(
            size, {"chips": chips, "regions": {}, "not_offered": []}
        )
        regions: dict[str, RegionPrice] = entry["regions"]  # type: ignore[assignment]
        absent: list[str] = entry["not_offered"]  # type: ignore[assignment]
        region, zone = row["Region"], row["AvailabilityZone"]
        on_demand, spot = _money(row["Price"]), _money(row["SpotPrice"])
        if on_demand is None or on_demand == NOT_OFFERED:
            if region not in absent:
                absent.append(region)
            continue
        spot = None if spot == NOT_OFFERED else spot
        seen = regions.get(region)
        if seen is None:
            regions[region] = RegionPrice(
                on_demand=on_demand, spot=spot, on_demand_per_chip=round(on_demand / chips, 6),
                spot_per_chip=None if spot is None else round(spot / chips, 6), zones=[zone],
            )  # fmt: skip
        elif (seen["on_demand"], seen["spot"]) != (on_demand, spot):
            raise SystemExit(f"{name} in {zone}: {on_demand}/{spot} differs from {seen['zones']}'s "
                             f"{seen['on_demand']}/{seen['spot']}; the table keeps one price per region")  # fmt: skip
        elif zone not in seen["zones"]:
            seen["zones"].append(zone)
    for sizes in families.values():
        for entry in sizes.values():
            regions = entry["regions"]  # type: ignore[assignment]
            entry["not_offered"] = sorted(set(entry["not_offered"]) - set(regions))  # type: ignore[arg-type]
    return {
        "source": {
            "name": "SkyPilot catalog",
            "repository": CATALOG,
            "path": CSV_PATH,
            "commit": commit,
            "date": date,
            "date_is": date_is,
        },
        "unit": "USD per hour for the whole slice; *_per_chip: USD per chip-hour",
        "families": {
            fam: {
                "catalog_name": names[fam],
                "slices": dict(sorted(sizes.items(), key=lambda kv: int(kv[0]))),
            }
            for fam, sizes in sorted(families.items())
        },
    }


def dump(table: dict[str, object]) -> str:
    """JSON with one slice per line (diffs between two catalog commits stay readable)."""
    families: dict[str, dict[str, object]] = table["families"]  # type: ignore[assignment]
    head = {k: v for k, v in table.items() if k != "families"}
    lines = [json.dumps(head, indent=2)[:-2] + ',\n  "families": {']
    for i, (fam, body) in enumerate(families.items()):
        slices: dict[str, object] = body["slices"]  # type: ignore[assignment]
        lines.append(f'    "{fam}": {{"catalog_name": "{body["catalog_name"]}", "slices": {{')
        items = [
            f'      "{size}": {json.dumps(entry, separators=(",", ":"))}' for size, entry in slices.items()
        ]
        lines.append(",\n".join(items))
        lines.append("    }}" + ("," if i < len(families) - 1 else ""))
    lines.append("  }\n}\n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", type=Path, help=f"a local copy of the catalog's {CSV_PATH}")
    ap.add_argument("--commit", required=True, help="the catalog repository's commit the CSV was read at")
    ap.add_argument("--date", required=True, help="that commit's date (YYYY-MM-DD)")
    ap.add_argument("--date-is", default="the commit's date", help="what --date is, said in the table")
    ap.add_argument(
        "--out", type=Path, default=OUT, help=f"where to write (default: {OUT.relative_to(REPO)})"
    )
    args = ap.parse_args(argv)
    with args.csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    table = build(rows, args.commit, args.date, args.date_is)
    args.out.write_text(dump(table))
    families: dict[str, dict[str, dict[str, object]]] = table["families"]  # type: ignore[assignment]
    sizes = sum(len(b["slices"]) for b in families.values())
    print(
        f"wrote {args.out}: {len(families)} families, {sizes} slice sizes, catalog {args.commit[:12]} {args.date}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
