"""The Cloud Billing Catalog routes the real `google-cloud-billing` client calls: services, and a service's SKUs,
with pages so the client's pager is exercised. Shaped as the real catalog prices TPUs: Compute Engine's service
holds v5e, v5p and v6e, the Cloud TPU service v2-v4 (as dstack's gpuhunt reads them); a TPU SKU has resource
group "TPU", an hourly unit per chip, a `Tpu...` name in its description, usage type OnDemand or Preemptible (Spot),
and beside them stand commitments and a TPU VM's host SKUs that a reader must leave out. Prices per chip-hour are
the shipped table's (its smallest slice of the family per region) until a test sets one with `/admin/catalog`."""

from __future__ import annotations

import re
import threading
from typing import Any

from tpuops.cloud.emulator.records import ApiError

COMPUTE = {"name": "services/6F81-5844-456A", "serviceId": "6F81-5844-456A", "displayName": "Compute Engine",
           "businessEntityName": "businessEntities/GCP"}  # fmt: skip
CLOUD_TPU = {"name": "services/E000-3F24-B8AA", "serviceId": "E000-3F24-B8AA", "displayName": "Cloud TPU",
             "businessEntityName": "businessEntities/GCP"}  # fmt: skip
OTHERS = [
    {"name": "services/95FF-2EF5-5EA1", "serviceId": "95FF-2EF5-5EA1", "displayName": "Cloud Storage",
     "businessEntityName": "businessEntities/GCP"},
]  # fmt: skip
NAMES = {"v4": "Tpu-v4", "v5e": "TpuV5e", "v5p": "TpuV5p", "v6e": "TpuV6e"}
SERVICE_OF = {"v4": CLOUD_TPU, "v5e": COMPUTE, "v5p": COMPUTE, "v6e": COMPUTE}


class Catalog:
    """Per family and region: (on demand, Spot) USD per chip-hour."""

    def __init__(self) -> None:
        from tpuops.cloud.price_table import table

        self.lock = threading.Lock()
        self.prices: dict[tuple[str, str], tuple[float, float]] = {}
        for family, body in table()["families"].items():
            if family not in NAMES:
                continue
            for size in sorted(body["slices"], key=int, reverse=True):  # the smallest slice's price wins
                for region, row in body["slices"][size]["regions"].items():
                    spot = (
                        row["spot_per_chip"]
                        if row["spot_per_chip"] is not None
                        else row["on_demand_per_chip"]
                    )
                    self.prices[(family, region)] = (row["on_demand_per_chip"], spot)

    def set(self, family: str, region: str, on_demand: float, spot: float) -> None:
        with self.lock:
            self.prices[(family, region)] = (float(on_demand), float(spot))

    def skus(self, service: dict[str, str]) -> list[dict[str, Any]]:
        with self.lock:
            items = sorted(self.prices.items())
        out = []
        if service is COMPUTE:
            out.append(_sku("6F81-0001-0001", "N1 Predefined Instance Core running in Americas", "OnDemand",
                            "us-central1", 0.031611, "Compute", "CPU"))  # fmt: skip
        for n, ((family, region), (on_demand, spot)) in enumerate(items):
            if SERVICE_OF[family] is not service:
                continue
            name = NAMES[family]
            out.append(
                _sku(f"7A{n:02d}-0000-0001", f"{name} chip-hour in {region}", "OnDemand", region, on_demand)
            )
            out.append(_sku(f"7A{n:02d}-0000-0002", f"{name} Spot Preemptible chip-hour in {region}", "Preemptible",
                            region, spot))  # fmt: skip
            out.append(_sku(f"7A{n:02d}-0000-0003", f"Commitment v1: {name} chip-hour in {region} for 1 Year",
                            "Commit1Yr", region, on_demand * 0.63))  # fmt: skip
            out.append(_sku(f"7A{n:02d}-0000-0004", f"{name} VM host RAM running in {region}", "OnDemand", region,
                            0.004, "Compute", "RAM"))  # fmt: skip
        return out


def _sku(sku_id: str, desc: str, usage: str, region: str, dollars: float, family: str = "Compute",
         group: str = "TPU") -> dict[str, Any]:  # fmt: skip
    units = int(dollars)
    return {
        "name": f"{COMPUTE['name']}/skus/{sku_id}", "skuId": sku_id, "description": desc,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": family, "resourceGroup": group,
                     "usageType": usage},
        "serviceRegions": [region],
        "pricingInfo": [{"effectiveTime": "2026-01-01T00:00:00Z", "pricingExpression": {
            "usageUnit": "h", "usageUnitDescription": "hour", "baseUnit": "s", "baseUnitDescription": "second",
            "baseUnitConversionFactor": 3600, "displayQuantity": 1,
            "tieredRates": [{"startUsageAmount": 0, "unitPrice": {
                "currencyCode": "USD", "units": str(units), "nanos": round((dollars - units) * 1e9)}}]}}],
        "serviceProviderName": "Google",
    }  # fmt: skip


def _page(items: list[dict[str, Any]], key: str, q: dict[str, str]) -> dict[str, Any]:
    size = int(q.get("pageSize") or 0) or 25  # small pages: the client's pager follows nextPageToken
    start = int(q.get("pageToken") or 0)
    end = start + size
    return {key: items[start:end], "nextPageToken": str(end) if end < len(items) else ""}


def route(catalog: Catalog, method: str, path: str, q: dict[str, str]) -> dict[str, Any] | None:
    """The answer to a catalog call, or None when the path is not the catalog's."""
    if method == "GET" and path == "/v1/services":
        return _page([COMPUTE, CLOUD_TPU, *OTHERS], "services", q)
    if method == "GET" and (r := re.fullmatch(r"/v1/services/([^/]+)/skus", path)):
        for service in (COMPUTE, CLOUD_TPU):
            if r[1] == service["serviceId"]:
                return _page(catalog.skus(service), "skus", q)
        if any(s["serviceId"] == r[1] for s in OTHERS):
            return _page([], "skus", q)
        raise ApiError(404, "NOT_FOUND", f"service services/{r[1]} not found")
    return None
