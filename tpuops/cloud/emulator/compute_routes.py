"""The emulator's Compute Engine REST routes: one call (method, path, query, body) -> the handler's JSON."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from tpuops.cloud.emulator.records import ApiError

if TYPE_CHECKING:
    from tpuops.cloud.emulator.compute import Compute

_PROJECT = r"/compute/v1/projects/(?P<p>[^/]+)"
_ZONE = _PROJECT + r"/zones/(?P<z>[^/]+)"
_REGION = _PROJECT + r"/regions/(?P<r>[^/]+)"
_GLOBAL = _PROJECT + r"/global"


def route(c: Compute, method: str, path: str, q: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """One Compute Engine call -> its JSON answer (raises ApiError)."""
    if r := re.fullmatch(_ZONE + r"/(?P<rest>.+)", path):
        p, z, rest = r["p"], r["z"], r["rest"]
        c._zone(p, z)
        base = f"projects/{p}/zones/{z}"
        if rest == "instances":
            if method == "GET":
                return {"kind": "compute#instanceList", "id": f"{base}/instances",
                        "items": c.list_instances(p, z, q.get("filter", ""))}  # fmt: skip
            if method == "POST":
                return c.insert_instance(p, z, body)
        if m := re.fullmatch(r"instances/([^/]+)", rest):
            if method == "GET":
                with c.m.lock:
                    return c.instance(f"{base}/instances/{m[1]}").to_json()
            if method == "DELETE":
                return c.delete_instance(f"{base}/instances/{m[1]}")
        if (m := re.fullmatch(r"instances/([^/]+)/getGuestAttributes", rest)) and method == "GET":
            return c.guest_attributes(f"{base}/instances/{m[1]}", q.get("queryPath", ""))
        if (m := re.fullmatch(r"instances/([^/]+)/stop", rest)) and method == "POST":
            return c.stop_instance(f"{base}/instances/{m[1]}")
        if (m := re.fullmatch(r"instances/([^/]+)/setMetadata", rest)) and method == "POST":
            return c.set_metadata(f"{base}/instances/{m[1]}", body)
        if rest == "instanceGroupManagers":
            if method == "POST":
                return c.insert_mig(p, z, body)
            if method == "GET":
                return {"items": c.list_migs(p, z, q.get("filter", ""))}
        if m := re.fullmatch(r"instanceGroupManagers/([^/]+)", rest):
            if method == "GET":
                return c.mig_json(f"{base}/instanceGroupManagers/{m[1]}")
            if method == "DELETE":
                return c.delete_mig(f"{base}/instanceGroupManagers/{m[1]}")
        if (
            m := re.fullmatch(r"instanceGroupManagers/([^/]+)/listManagedInstances", rest)
        ) and method == "POST":
            return c.managed_instances(f"{base}/instanceGroupManagers/{m[1]}")
        if (m := re.fullmatch(r"operations/([^/]+)", rest)) and method == "GET":
            return c.get(c.ops, f"{base}/operations/{m[1]}")
    if r := re.fullmatch(_REGION + r"/(?P<rest>.+)", path):
        p, reg, rest = r["p"], r["r"], r["rest"]
        c._region(p, reg)
        base = f"projects/{p}/regions/{reg}"
        if rest == "resourcePolicies" and method == "POST":
            return c.insert_policy(p, reg, body)
        if m := re.fullmatch(r"resourcePolicies/([^/]+)", rest):
            if method == "GET":
                return c.get(c.policies, f"{base}/resourcePolicies/{m[1]}")
            if method == "DELETE":
                return c.delete_plain(c.policies, f"{base}/resourcePolicies/{m[1]}", f"regions/{reg}")
        if (m := re.fullmatch(r"operations/([^/]+)", rest)) and method == "GET":
            return c.get(c.ops, f"{base}/operations/{m[1]}")
    if r := re.fullmatch(_GLOBAL + r"/(?P<rest>.+)", path):
        p, rest = r["p"], r["rest"]
        base = f"projects/{p}/global"
        if rest == "instanceTemplates" and method == "POST":
            return c.insert_template(p, body)
        if m := re.fullmatch(r"instanceTemplates/([^/]+)", rest):
            if method == "GET":
                return c.get(c.templates, f"{base}/instanceTemplates/{m[1]}")
            if method == "DELETE":
                return c.delete_plain(c.templates, f"{base}/instanceTemplates/{m[1]}", "global")
        if (m := re.fullmatch(r"operations/([^/]+)", rest)) and method == "GET":
            return c.get(c.ops, f"{base}/operations/{m[1]}")
    if (
        r := re.fullmatch(_PROJECT + r"/aggregated/(instances|instanceGroupManagers)", path)
    ) and method == "GET":
        return _aggregated(c, r["p"], r[2], q.get("filter", ""))
    raise ApiError(404, "NOT_FOUND", f"no route for {method} {path}")


def _aggregated(c: Compute, project: str, what: str, flt: str) -> dict[str, Any]:
    """aggregatedList: one scope per zone, a NO_RESULTS_ON_PAGE warning where the zone has none."""
    items: dict[str, Any] = {}
    for zone in c.m.zones:
        found = (
            c.list_instances(project, zone, flt) if what == "instances" else c.list_migs(project, zone, flt)
        )
        scope = f"zones/{zone}"
        items[scope] = (
            {what: found}
            if found
            else {"warning": {"code": "NO_RESULTS_ON_PAGE", "data": [{"key": "scope", "value": scope}],
                              "message": f"There are no results for scope '{scope}' on this page."}}
        )  # fmt: skip
    kind = "instanceAggregatedList" if what == "instances" else "instanceGroupManagerAggregatedList"
    return {"kind": f"compute#{kind}", "id": f"projects/{project}/aggregated/{what}", "items": items}
