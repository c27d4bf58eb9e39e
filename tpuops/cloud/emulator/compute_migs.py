"""The emulator's managed instance groups: a MIG whose instances are the workers of one slice (made from an
instance template and checked against its workload policy's topology), listed, read and deleted."""

from __future__ import annotations

import time
from typing import Any

from tpuops.cloud.emulator.compute_records import (
    BASE,
    InstanceRec,
    _check_topology,
    _filter,
    _id,
    _resolve_policy,
    _suffix,
)
from tpuops.cloud.emulator.records import ApiError


class MigOps:
    """The MIG half of `Compute` (a mixin: it shares the instances, templates, policies and operations)."""

    m: Any  # the emulator's Model (its lock, users, spawn)
    instances: dict[str, InstanceRec]
    templates: dict[str, dict[str, Any]]
    policies: dict[str, dict[str, Any]]
    migs: dict[str, dict[str, Any]]

    # Compute's own (defined there): operations, reads, instances made and removed.
    def _op(self, project: str, scope: str, kind: str, target: str) -> dict[str, Any]:
        raise NotImplementedError

    def _done(self, op: dict[str, Any], error: tuple[int, str, str] | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def get(self, table: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
        raise NotImplementedError

    def insert_instance(
        self, project: str, zone: str, body: dict[str, Any], mig: str = "", number: int = -1
    ) -> dict[str, Any]:
        raise NotImplementedError

    def _remove(self, rec: InstanceRec, op: dict[str, Any] | None) -> None:
        raise NotImplementedError

    def insert_mig(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        mig = f"projects/{project}/zones/{zone}/instanceGroupManagers/{body.get('name', '')}"
        template = "projects/" + body.get("instanceTemplate", "").split("projects/", 1)[-1]
        size = int(body.get("targetSize", 0))
        policy_ref = body.get("resourcePolicies", {}).get("workloadPolicy", "")
        with self.m.lock:
            if mig in self.migs:
                raise ApiError(409, "ALREADY_EXISTS", f"The resource '{mig}' already exists")
            if template not in self.templates:
                raise ApiError(404, "NOT_FOUND", f"The resource '{template}' was not found")
            props = self.templates[template].get("properties", {})
            policy = ""
            if policy_ref:
                policy = _resolve_policy(project, policy_ref)
                if policy not in self.policies:
                    raise ApiError(404, "NOT_FOUND", f"The resource '{policy}' was not found")
                _check_topology(props.get("machineType", ""), self.policies[policy], size)
            self.migs[mig] = {
                **body, "kind": "compute#instanceGroupManager", "id": _id(), "name": body["name"],
                "zone": f"{BASE}projects/{project}/zones/{zone}", "instanceTemplate": BASE + template,
                "selfLink": BASE + mig, "_template": template, "_policy": policy,
            }  # fmt: skip
            op = self._op(project, f"zones/{zone}", "insert", mig)
            members = []
            for i in range(size):
                inst = {**props, "name": f"{body.get('baseInstanceName') or body['name']}-{_suffix()}"}
                members.append(self.insert_instance(project, zone, inst, mig=mig, number=i))
        self.m._spawn(self._await_all, members, op)
        return op

    def _await_all(self, ops: list[dict[str, Any]], op: dict[str, Any]) -> None:
        while any(o["status"] != "DONE" for o in ops):
            time.sleep(0.02)
        failed = [o for o in ops if "error" in o]
        if failed:
            err = failed[0]["error"]["errors"][0]
            self._done(op, (failed[0]["httpErrorStatusCode"], err["code"], err["message"]))
        else:
            self._done(op)

    def members(self, mig: str) -> list[InstanceRec]:
        return sorted((r for r in self.instances.values() if r.mig == mig), key=lambda r: r.short)

    def mig_json(self, name: str) -> dict[str, Any]:
        with self.m.lock:
            mig = {k: v for k, v in self.get(self.migs, name).items() if not k.startswith("_")}
            members = self.members(name)
            mig["status"] = {"isStable": all(r.action == "NONE" for r in members)}
            mig["currentActions"] = {
                "none": sum(r.action == "NONE" for r in members),
                "creating": sum(r.action == "CREATING" for r in members),
                "recreating": sum(r.action == "RECREATING" for r in members),
            }
            return mig

    def list_migs(self, project: str, zone: str | None, flt: str) -> list[dict[str, Any]]:
        match = _filter(flt)
        with self.m.lock:
            names = [k for k, v in sorted(self.migs.items())
                     if k.split("/")[1] == project and (zone is None or k.split("/")[3] == zone)
                     and match(v["name"])]  # fmt: skip
        return [self.mig_json(n) for n in names]

    def managed_instances(self, mig: str) -> dict[str, Any]:
        """Each member: its URL, name, currentAction; `id` and `instanceStatus` only while the VM exists."""
        with self.m.lock:
            self.get(self.migs, mig)
            out = []
            for r in self.members(mig):
                entry = {"instance": BASE + r.name, "name": r.short, "currentAction": r.action,
                         "targetStatus": "RUNNING"}  # fmt: skip
                if r.workers or r.status == "TERMINATED":
                    entry.update(id=r.id, instanceStatus=r.status)
                out.append(entry)
            return {"managedInstances": out}

    def delete_mig(self, name: str) -> dict[str, Any]:
        with self.m.lock:
            self.get(self.migs, name)
            members = self.members(name)
            for r in members:
                r.action, r.status = "DELETING", "STOPPING"
            op = self._op(name.split("/")[1], f"zones/{name.split('/')[3]}", "delete", name)

        def remove() -> None:
            for r in members:
                self._remove(r, None)
            with self.m.lock:
                self.migs.pop(name, None)
            self._done(op)

        self.m._spawn(remove)
        return op
