"""Where a VM was last found (zone and kind), per endpoint, project and name: a short-lived cache under the state
home, so `--vm NAME` without --zone is one get instead of a search of every zone."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TypedDict, cast

from tpuops.cloud.client import Api
from tpuops.config import state_home

CACHE_TTL_S = 600.0  # a VM does not move zones; the entry is dropped as soon as the VM is not found there


class Entry(TypedDict):
    zone: str
    t: float  # when it was written (time.time())
    kind: str  # node, instance, mig, ...


def _cache_path() -> Path:
    return state_home() / "zone-cache.json"


def _cache_key(api: Api, name: str) -> str:
    return f"{api.endpoint or 'tpu.googleapis.com'}|{api.project}|{name}"


def _cached(api: Api, name: str) -> Entry | None:
    try:
        entry = cast(Entry | None, json.loads(_cache_path().read_text()).get(_cache_key(api, name)))
    except (OSError, ValueError):
        return None
    return entry if entry and time.time() - entry["t"] < CACHE_TTL_S else None


def cached_zone(api: Api, name: str) -> str | None:
    entry = _cached(api, name)
    return entry["zone"] if entry else None


def remember_zone(api: Api, name: str, zone: str | None, kind: str = "node") -> None:
    """Record (or with zone=None forget) where a VM lives and what it is (node, instance, mig); expired
    entries are dropped on every write."""
    path = _cache_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    now = time.time()
    data = {k: v for k, v in data.items() if now - v["t"] < CACHE_TTL_S}
    if zone:
        data[_cache_key(api, name)] = {"zone": zone, "t": now, "kind": kind}
    else:
        data.pop(_cache_key(api, name), None)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)
