"""TPU prices per chip-hour (on demand and Spot) for a slice type and region, and what a step and a run cost.

From Google's Cloud Billing Catalog API (TPU SKUs of the Compute Engine and Cloud TPU services; Spot SKUs are
usage type "Preemptible") when credentials allow or an endpoint is given (the emulator), cached under the state
home with the date they were fetched; otherwise from the table shipped in the package (tpuops.cloud.price_table:
SkyPilot's public catalog at a recorded commit and date). Every answer says which was used and how old it is; a
region that does not offer the type gets no price (Unpriced, naming the nearest regions that do).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NotRequired, TypedDict, cast

from tpuops.cloud import accelerators, price_table
from tpuops.cloud.price_table import Unpriced, region_of
from tpuops.config import state_home

if TYPE_CHECKING:
    from google.cloud.billing_v1 import Sku
    from google.type.money_pb2 import Money

CACHE_DAYS = 7  # a catalog fetch is reused this long
COMPUTE_ENGINE = "Compute Engine"
# The billing catalog prices TPUs under two services: Cloud TPU (v2, v3, v4) and Compute Engine (v5e, v5p, v6e).
TPU_SERVICES = (COMPUTE_ENGINE, "Cloud TPU")
DEFAULT_REGION = "us-central1"
# A TPU SKU of the catalog: "TPU v6e chip-hour in us-east5", "Spot Preemptible TPU v5e ...", "Trillium TPU ...".
_SKU_FAMILY = re.compile(
    r"\b(?:TPU[ -]?(?P<v>v4|v5e|v5 ?lite(?:pod)?|v5p|v6e|7x)|(?P<trillium>Trillium))\b", re.I
)
_NOT_ON_DEMAND = re.compile(r"commit|reserv|calendar|flex|dws|dynamic workload", re.I)
Prices = dict[str, dict[str, dict[str, float]]]  # family -> region -> {"on_demand": $, "spot": $}


class PriceDict(TypedDict):
    """`Price.to_dict()`: its fields, the unit, and the table's source when it came from the table."""

    family: str
    region: str
    on_demand: float
    spot: float | None
    source: str
    where: str
    date: str
    age_days: int
    commit: str
    unit: str
    catalog: NotRequired[price_table.Source]


class Dollars(TypedDict):
    on_demand: float | None
    spot: float | None


class Cost(TypedDict):
    """What a step and a run cost (`cost()`), as --json and result.json carry it."""

    accelerator: str
    chips: int
    region: str
    step_s: float
    step_basis: str
    steps: int | None
    per_step: Dollars
    per_run: Dollars | None
    price: PriceDict


@dataclass(frozen=True)
class Price:
    """USD per chip-hour of one family in one region, and where the figures came from."""

    family: str
    region: str
    on_demand: float
    spot: float | None
    source: str  # "catalog" (Cloud Billing Catalog API) or "table" (shipped with tpuops)
    where: str  # the billing endpoint, or the table's source (catalog repository and path)
    date: str  # ISO date: when the billing catalog was fetched, or the table's catalog date
    age_days: int
    commit: str = ""  # the table's catalog commit ("" for the billing catalog)

    def to_dict(self) -> PriceDict:
        out = cast(PriceDict, {**asdict(self), "unit": "USD per chip-hour"})
        if self.source == "table":
            out["catalog"] = price_table.source()
        return out


def _age(date: str, today: datetime.date | None = None) -> int:
    today = today or datetime.datetime.now(datetime.UTC).date()
    return max(0, (today - datetime.date.fromisoformat(date[:10])).days)


def from_table(accelerator_type: str, region: str) -> Price | Unpriced:
    """The shipped table's price per chip-hour of this slice type in `region`, or why it has none."""
    row = price_table.price_in(accelerator_type, region)
    if isinstance(row, Unpriced):
        return row
    src = price_table.source()
    return Price(accelerators.family(accelerator_type), region, row["on_demand_per_chip"], row["spot_per_chip"],
                 "table", f"{src['repository']}/blob/{src['commit'][:8]}/{src['path']}", src["date"],
                 _age(src["date"]), src["commit"])  # fmt: skip


def _money(unit_price: Money) -> float:
    return round(int(unit_price.units or 0) + int(unit_price.nanos or 0) / 1e9, 9)


def _family_of(description: str) -> str | None:
    m = _SKU_FAMILY.search(description)
    if not m:
        return None
    if m["trillium"]:
        return "v6e"
    v = m["v"].lower().replace(" ", "")
    return "v5e" if v.startswith("v5lite") else ("tpu7x" if v == "7x" else v)


def parse_skus(skus: list[Sku]) -> Prices:
    """family -> region -> {"on_demand": $, "spot": $} from the catalog's SKU objects (per chip-hour, hourly
    units only; commitments, reservations and flex-start SKUs left out)."""
    out: Prices = {}
    for sku in skus:
        desc = sku.description or ""
        family = _family_of(desc)
        usage = sku.category.usage_type if sku.category else ""
        group = sku.category.resource_group if sku.category else ""
        if family is None or _NOT_ON_DEMAND.search(desc) or usage not in ("OnDemand", "Preemptible"):
            continue
        if group and group != "TPU":  # a TPU VM's host CPU or RAM SKU that names the TPU
            continue
        kind = (
            "spot"
            if usage == "Preemptible" or re.search(r"\bspot\b|preemptible", desc, re.I)
            else "on_demand"
        )
        if not sku.pricing_info:
            continue
        expr = sku.pricing_info[0].pricing_expression
        if expr.usage_unit != "h" or not expr.tiered_rates:
            continue
        dollars = _money(expr.tiered_rates[-1].unit_price)
        for region in sku.service_regions:
            out.setdefault(family, {}).setdefault(region, {})[kind] = dollars
    return out


def fetch_catalog(endpoint: str | None) -> Prices:
    """The TPU prices of the catalog: the real `google-cloud-billing` client over REST (anonymous credentials
    against `endpoint`, Application Default Credentials otherwise)."""
    from google.cloud import billing_v1

    from tpuops.cloud.client import build

    client = build(billing_v1.CloudCatalogClient, endpoint)
    services = [s for s in client.list_services() if s.display_name in TPU_SERVICES]
    if not services:
        raise LookupError(f"the catalog lists none of the services {', '.join(TPU_SERVICES)}")
    return parse_skus([sku for s in services for sku in client.list_skus(parent=s.name)])


def _credentials_present() -> bool:
    """Application Default Credentials that need no network to find (a key file or gcloud's ADC file)."""
    if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        return True
    root = Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")
    return (root / "application_default_credentials.json").is_file()


def _cache_file(endpoint: str | None) -> Path:
    key = hashlib.sha256((endpoint or "cloudbilling.googleapis.com").encode()).hexdigest()[:12]
    return state_home() / "prices" / f"catalog-{key}.json"


def catalog(endpoint: str | None, *, refresh: bool = False) -> tuple[Prices, str] | None:
    """(prices, fetch date) from the cache when under CACHE_DAYS old, else fetched and cached; None when there
    are no credentials and no endpoint, or the catalog cannot be read (the table is used then)."""
    if not endpoint and not _credentials_present():
        return None
    path = _cache_file(endpoint)
    if not refresh and path.is_file():
        try:
            cached = json.loads(path.read_text())
            if _age(cached["date"]) < CACHE_DAYS:
                return cached["prices"], cached["date"]
        except (OSError, ValueError, KeyError):
            pass  # a damaged entry is fetched again
    try:
        prices = fetch_catalog(endpoint)
    except Exception:
        return None
    date = datetime.datetime.now(datetime.UTC).date().isoformat()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"date": date, "endpoint": endpoint, "prices": prices}))
    tmp.replace(path)
    return prices, date


def lookup(accelerator_type: str, region: str | None = None, endpoint: str | None = None) -> Price | Unpriced:
    """The price of one chip-hour of this slice type in `region` (a zone is read as its region): the billing
    catalog when it has the family in that region, else the shipped table; Unpriced (why, and the nearest regions
    that offer the type) when neither prices it there."""
    family = accelerators.family(accelerator_type)
    region = region_of(region) if region else DEFAULT_REGION
    found = catalog(endpoint)
    if found is not None:
        prices, date = found
        row = prices.get(family, {}).get(region)
        if row and "on_demand" in row:
            return Price(family, region, row["on_demand"], row.get("spot"), "catalog",
                         endpoint or "cloudbilling.googleapis.com", date, _age(date))  # fmt: skip
    got = from_table(accelerator_type, region)
    if isinstance(got, Unpriced) and family not in price_table.table()["families"]:
        billing = (
            f"the Cloud Billing Catalog lists none in {region} either" if found is not None
            else "the Cloud Billing Catalog is read when credentials allow (gcloud auth application-default login)"
        )  # fmt: skip
        return Unpriced(got.accelerator, got.region, f"{got.reason}; {billing}", got.nearest)
    return got


def cost(
    step_s: float, steps: int | None, accelerator_type: str, price: Price, basis: str, slices: int = 1
) -> Cost:
    """Dollars per step and per run, on demand and Spot: step seconds x chips x price per chip-hour (a multislice:
    every slice's chips)."""
    chips = accelerators.chips(accelerator_type) * slices
    if slices > 1:
        accelerator_type = f"{slices} x {accelerator_type}"

    def money(per_hour: float | None, n: float) -> float | None:
        return None if per_hour is None else round(step_s * n / 3600 * chips * per_hour, 6)

    return {
        "accelerator": accelerator_type, "chips": chips, "region": price.region, "step_s": step_s,
        "step_basis": basis, "steps": steps,
        "per_step": {"on_demand": money(price.on_demand, 1), "spot": money(price.spot, 1)},
        "per_run": None if steps is None else {"on_demand": money(price.on_demand, steps),
                                                "spot": money(price.spot, steps)},
        "price": price.to_dict(),
    }  # fmt: skip


def dollars(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1:
        return f"${x:,.2f}"
    return f"${x:.4f}" if x >= 0.0001 or x == 0 else "<$0.0001"  # a tiny config's step rounds to nothing


def cost_line(record: Mapping[str, object]) -> str:
    """`cost: $0.0094/step, $1.88/run (200 steps) on demand; Spot $0.0028/step, $0.56/run - v6e-8 (8 chips) in
    us-central1 at $2.70/chip-hour (Spot $0.65), step 1.57 s (expected_mid_s): shipped table (SkyPilot catalog
    017e2502, 2026-11-29, 0 days old)`. `record`: a `cost()`, or one read back from a run's JSON."""
    c = cast(Cost, record)
    p, s, r = c["price"], c["per_step"], c["per_run"]

    def run(kind: Literal["on_demand", "spot"]) -> str:
        return f", {dollars(r[kind])}/run" if r else ""

    steps = f" ({c['steps']} steps)" if r else " (steps unknown)"
    spot = f"; Spot {dollars(s['spot'])}/step{run('spot')}" if s["spot"] is not None else "; no Spot price"
    if p["source"] == "catalog":
        src = f"Cloud Billing Catalog ({p['where'].removeprefix('https://')}, {p['date']}, {p['age_days']} days old)"
    else:
        src = f"shipped table (SkyPilot catalog {p['commit'][:8]}, {p['date']}, {p['age_days']} days old)"
    spot_rate = f" (Spot ${p['spot']:.2f})" if p["spot"] is not None else ""
    return (f"cost: {dollars(s['on_demand'])}/step{run('on_demand')}{steps} on demand{spot} - {c['accelerator']} "
            f"({c['chips']} chips) in {c['region']} at ${p['on_demand']:.2f}/chip-hour{spot_rate}, step "
            f"{c['step_s']:.2f} s ({c['step_basis']}): {src}")  # fmt: skip
