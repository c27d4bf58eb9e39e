"""Zone names checked before any call: the TPU zones tpuops knows (the shipped price table's, and the
emulator's own), a did-you-mean for a typo, and which zones offer an accelerator type."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from tpuops.errors import CloudError, UsageError

if TYPE_CHECKING:
    from tpuops.cloud.client import Api

# The zones the emulator offers unless told others (`tpuops emulator serve --zone`).
EMULATOR_ZONES = [
    "us-central1-a", "us-central1-b", "us-central2-b", "us-east1-d", "us-east5-a", "us-east5-b",
    "us-south1-a", "us-west4-a", "europe-west4-a", "europe-west4-b", "asia-northeast1-b", "asia-southeast1-b",
]  # fmt: skip


def table_zones(accelerator_type: str | None = None) -> list[str]:
    """Zones of the shipped price table (data/tpu_prices.json): every TPU zone it lists, or those offering
    one accelerator type."""
    from tpuops.cloud import accelerators, price_table

    families = price_table.table()["families"]
    if accelerator_type:
        acc = accelerators.parse(accelerator_type)
        fam = families.get(acc.price_family)
        entry = fam["slices"].get(str(acc.size)) if fam else None
        entries = [entry] if entry else []
    else:
        entries = [e for fam in families.values() for e in fam["slices"].values()]
    return sorted({z for e in entries for row in e["regions"].values() for z in row["zones"]})


def known_zones(endpoint: str | None) -> list[str]:
    """Every TPU zone tpuops knows without a call: the price table's, plus the emulator's with an endpoint."""
    return sorted(set(table_zones()) | (set(EMULATOR_ZONES) if endpoint else set()))


def check_zone(zone: str, endpoint: str | None, api: Api | None = None) -> str:
    """`zone` when it is a known TPU zone; one the table does not know is asked of the API's own locations
    (the one call, made only then: an emulator started with other zones, a zone newer than the table). Else a
    UsageError (exit 2) with the closest known zones."""
    known = known_zones(endpoint)
    if zone in known:
        return zone
    listed: list[str] = []
    if api is not None:
        try:
            listed = api.zones()
        except CloudError:
            listed = []
        if zone in listed:
            return zone
    everywhere = sorted(listed or known)  # the API's own zones when it named them (an emulator's few)
    close = difflib.get_close_matches(zone, everywhere, n=3, cutoff=0.6)
    region = [z for z in everywhere if z.rsplit("-", 1)[0] == zone.rsplit("-", 1)[0]]
    hint = f"did you mean {', '.join(close)}?" if close else "no TPU zone is close to it"
    if region and not close:
        hint = f"TPU zones of {zone.rsplit('-', 1)[0]}: {', '.join(region)}"
    raise UsageError(f"unknown TPU zone {zone!r}", hint=hint)


def not_offered(accelerator_type: str, zone: str, api: Api) -> CloudError:
    """The API answered "not found" for `zone`: one line naming the zones (of this API) that offer the type."""
    try:
        listed = set(api.zones())
    except CloudError:
        listed = set()
    offering = [z for z in table_zones(accelerator_type) if not listed or z in listed]
    if not offering:  # the table knows no zone of this API for it (an emulator, a type it has no price for)
        offering = sorted(listed)
    where = ", ".join(offering[:12]) + (f" (+{len(offering) - 12} more)" if len(offering) > 12 else "")
    return CloudError(
        f"{accelerator_type} is not offered in {zone}" + (f"; zones that offer it: {where}" if where else ""),
        hint=f"e.g. --zone {offering[0]}" if offering else "",
    )
