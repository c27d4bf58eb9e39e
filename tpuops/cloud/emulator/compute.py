"""The emulator's Compute Engine side: TPU VM instances (one real sshd each), instance templates, workload
policies, zone/region/global operations, and the faults of a Spot VM (preempted: TERMINATED) and of a MIG (an
instance recreated with a new address and host key). MIGs: compute_migs.py; records: compute_records.py; the
REST routes: compute_routes.py."""

from __future__ import annotations

import re
import secrets
import time
import uuid
from typing import Any

from tpuops.cloud.accelerators import accelerator_of
from tpuops.cloud.emulator import metadata
from tpuops.cloud.emulator.compute_migs import MigOps
from tpuops.cloud.emulator.compute_records import (
    BASE,
    REPAIR_DELAY_S,
    WORKER_NUMBER,
    InstanceRec,
    _filter,
    _id,
    _metadata_dict,
    _now,
    _short,
)
from tpuops.cloud.emulator.records import EMULATOR_NS, ApiError, _power_off, authorized_keys_from_metadata

__all__ = ["Compute", "InstanceRec"]


class Compute(MigOps):
    """Compute Engine state of one emulator; shares the model's lock, sshd users and request log."""

    def __init__(self, model: Any) -> None:
        self.m = model
        self.instances: dict[str, InstanceRec] = {}
        self.templates: dict[str, dict[str, Any]] = {}  # projects/P/global/instanceTemplates/T -> JSON
        self.policies: dict[str, dict[str, Any]] = {}  # projects/P/regions/R/resourcePolicies/X -> JSON
        self.migs: dict[str, dict[str, Any]] = {}  # projects/P/zones/Z/instanceGroupManagers/M -> JSON
        self.ops: dict[str, dict[str, Any]] = {}  # projects/P/{zones/Z|regions/R|global}/operations/O -> JSON
        model.compute = self

    # -- helpers ----------------------------------------------------------------------------------------
    def _zone(self, project: str, zone: str) -> None:
        if zone not in self.m.zones:
            raise ApiError(404, "NOT_FOUND", f"The resource 'projects/{project}/zones/{zone}' was not found")

    def _region(self, project: str, region: str) -> None:
        if region not in {z.rsplit("-", 1)[0] for z in self.m.zones}:
            raise ApiError(
                404, "NOT_FOUND", f"The resource 'projects/{project}/regions/{region}' was not found"
            )

    def _op(self, project: str, scope: str, kind: str, target: str) -> dict[str, Any]:
        """A RUNNING operation in `scope` (zones/Z, regions/R or global) on `target` (a resource path)."""
        name = f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:13]}-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:8]}"
        path = f"projects/{project}/{scope}/operations/{name}"
        op: dict[str, Any] = {
            "kind": "compute#operation", "id": _id(), "name": name, "operationType": kind, "status": "RUNNING",
            "progress": 0, "targetLink": BASE + target, "targetId": _id(), "user": "emulator@tpuops",
            "insertTime": _now(), "startTime": _now(), "selfLink": BASE + path,
        }  # fmt: skip
        if scope.startswith("zones/"):
            op["zone"] = f"{BASE}projects/{project}/{scope}"
        elif scope.startswith("regions/"):
            op["region"] = f"{BASE}projects/{project}/{scope}"
        self.ops[path] = op
        return op

    def _done(self, op: dict[str, Any], error: tuple[int, str, str] | None = None) -> dict[str, Any]:
        """Finish an operation; `error` = (HTTP status, error code, message), as Compute reports a failed op."""
        with self.m.lock:
            op.update(status="DONE", progress=100, endTime=_now())
            if error:
                http, code, message = error
                op["error"] = {"errors": [{"code": code, "message": message}]}
                op["httpErrorStatusCode"] = http
                op["httpErrorMessage"] = {400: "BAD REQUEST", 412: "PRECONDITION FAILED"}.get(
                    http, "SERVICE UNAVAILABLE"
                )
        return op

    def instance(self, name: str) -> InstanceRec:
        rec = self.instances.get(name)
        if rec is None:
            raise ApiError(404, "NOT_FOUND", f"The resource '{name}' was not found")
        return rec

    # -- instances --------------------------------------------------------------------------------------
    def insert_instance(
        self, project: str, zone: str, body: dict[str, Any], mig: str = "", number: int = -1
    ) -> dict:
        name = f"projects/{project}/zones/{zone}/instances/{body.get('name', '')}"
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", body.get("name", "")):
            raise ApiError(
                400, "INVALID_ARGUMENT", f"Invalid value for field 'resource.name': '{body.get('name')}'"
            )
        machine = _short(body.get("machineType", ""))
        if not accelerator_of(machine):
            raise ApiError(
                400, "INVALID_ARGUMENT",
                f"Invalid value for field 'resource.machineType': '{machine}'. The emulator serves TPU machine "
                "types only (ct5lp-hightpu-*, ct5p-hightpu-*, ct6e-standard-*, tpu7x-standard-*).",
            )  # fmt: skip
        with self.m.lock:
            if name in self.instances:
                raise ApiError(409, "ALREADY_EXISTS", f"The resource '{name}' already exists")
            md = _metadata_dict(body.get("metadata"))
            if number >= 0:
                md[WORKER_NUMBER] = str(number)
            if mig:  # what Compute Engine writes on a MIG's instances (the project by number there)
                md["created-by"] = mig
            rec = InstanceRec(name, {**body, "metadata": md}, mig=mig)
            op = self._op(project, f"zones/{zone}", "insert", name)
            if self.m._take_capacity_fault(zone):
                self._done(op, (503, "ZONE_RESOURCE_POOL_EXHAUSTED",
                                f"The zone 'projects/{project}/zones/{zone}' does not have enough resources "
                                "available to fulfill the request. Try a different zone, or try again later."))  # fmt: skip
                return op
            self.instances[name] = rec
            user = self.m.take_user()
        self.m._spawn(self._boot, rec, op, user)
        return op

    def _keys(self, rec: InstanceRec) -> str:
        return authorized_keys_from_metadata(rec.body["metadata"]) or self.m.authorized_key

    def _boot(self, rec: InstanceRec, op: dict[str, Any] | None, user: str) -> None:
        directory = self.m.state_dir / "instances" / f"{rec.name.replace('/', '_')}-g{rec.generation}"
        try:
            worker = self.m.start_sshd(0, directory, self._keys(rec), user)
        except (OSError, RuntimeError) as e:
            with self.m.lock:
                self.m._release(user)
                rec.status = "TERMINATED"
            if op is not None:
                self._done(op, (500, "INTERNAL_ERROR", f"emulator could not start sshd for {rec.name}: {e}"))
            return
        time.sleep(self.m.create_delay)
        with self.m.lock:
            gone = self.instances.get(rec.name) is not rec  # deleted (or torn down) while it booted
        # Its processes gone first, then its user handed back: never a user with a late kill still to come.
        if gone:
            _power_off(worker)
            worker.stop()
            with self.m.lock:
                self.m._release(user)
            if op is not None:
                self._done(op)
            return
        with self.m.lock:
            rec.workers, rec.published_keys = [worker], [worker.host_public_key]
            self.m._apply_keys(rec)
            rec.status, rec.action = "RUNNING", "NONE"
        if op is not None:
            self._done(op)

    def delete_instance(self, name: str) -> dict[str, Any]:
        with self.m.lock:
            rec = self.instance(name)
            if rec.mig:
                raise ApiError(400, "FAILED_PRECONDITION",
                               f"The instance '{name}' is managed by {rec.mig}: resize or delete the group")  # fmt: skip
            rec.status = "STOPPING"
            op = self._op(rec.project, f"zones/{rec.zone}", "delete", name)
        self.m._spawn(self._remove, rec, op)
        return op

    def stop_instance(self, name: str) -> dict[str, Any]:
        """instances.stop: STOPPING, its processes gone, then TERMINATED (a stopped instance's status)."""
        with self.m.lock:
            rec = self.instance(name)
            rec.status = "STOPPING"
            op = self._op(rec.project, f"zones/{rec.zone}", "stop", name)

        def stop() -> None:
            self._power_down(rec)
            with self.m.lock:
                rec.status = "TERMINATED"
            self._done(op)

        self.m._spawn(stop)
        return op

    def _power_down(self, rec: InstanceRec) -> None:
        with rec.power:
            for w in rec.workers:
                _power_off(w)
                w.stop()
            with self.m.lock:
                for w in rec.workers:
                    self.m._release(w.user)
                rec.workers = []

    def _remove(self, rec: InstanceRec, op: dict[str, Any] | None) -> None:
        self._power_down(rec)
        with self.m.lock:
            self.instances.pop(rec.name, None)
        if op is not None:
            self._done(op)

    def list_instances(self, project: str, zone: str | None, flt: str) -> list[dict[str, Any]]:
        match = _filter(flt)
        with self.m.lock:
            return [
                r.to_json() for k, r in sorted(self.instances.items())
                if r.project == project and (zone is None or r.zone == zone) and match(r.short)
            ]  # fmt: skip

    def guest_attributes(self, name: str, query_path: str) -> dict[str, Any]:
        """As the guest agent publishes them (namespace `hostkeys`, key = key type, value = the base64 blob),
        filtered by `queryPath`; the emulator's own namespace (sshd port, user) always comes along."""
        with self.m.lock:
            rec = self.instance(name)
            if not rec.workers:
                raise ApiError(404, "NOT_FOUND", f"The resource '{name}/guestAttributes' was not found")
            keytype, blob = rec.published_keys[0].split()[:2]
            items = [it for it in [{"namespace": "hostkeys", "key": keytype, "value": blob}]
                     if f"{it['namespace']}/{it['key']}".startswith(query_path)]  # fmt: skip
            items += [it for it in metadata.guest_items(rec.workers[0].state_dir)
                      if f"{it['namespace']}/{it['key']}".startswith(query_path)]  # fmt: skip
            items.append({"namespace": EMULATOR_NS, "key": "ssh-port", "value": str(rec.workers[0].port)})
            if not self.m.oslogin_on(rec):
                items.append({"namespace": EMULATOR_NS, "key": "ssh-user", "value": rec.workers[0].user})
            return {
                "kind": "compute#guestAttributes",
                "queryPath": query_path,
                "queryValue": {"items": items},
            }

    def set_metadata(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.m.lock:
            rec = self.instance(name)
            if body.get("fingerprint", "") != rec.fingerprint:
                raise ApiError(412, "FAILED_PRECONDITION",
                               "Supplied fingerprint does not match current metadata fingerprint.")  # fmt: skip
            md = _metadata_dict(body)
            rec.body["metadata"], rec.fingerprint = md, secrets.token_urlsafe(8)
            op = self._op(rec.project, f"zones/{rec.zone}", "setMetadata", name)
            if rec.workers:
                self.m._apply_keys(rec)
        return self._done(op)

    # -- templates, workload policies -------------------------------------------------------------------
    def insert_template(self, project: str, body: dict[str, Any]) -> dict[str, Any]:
        name = f"projects/{project}/global/instanceTemplates/{body.get('name', '')}"
        with self.m.lock:
            if name in self.templates:
                raise ApiError(409, "ALREADY_EXISTS", f"The resource '{name}' already exists")
            self.templates[name] = {
                **body,
                "kind": "compute#instanceTemplate",
                "id": _id(),
                "selfLink": BASE + name,
            }
            op = self._op(project, "global", "insert", name)
        return self._done(op)

    def insert_policy(self, project: str, region: str, body: dict[str, Any]) -> dict[str, Any]:
        name = f"projects/{project}/regions/{region}/resourcePolicies/{body.get('name', '')}"
        topo = body.get("workloadPolicy", {}).get("acceleratorTopology", "")
        if topo and not re.fullmatch(r"\d+x\d+(x\d+)?", topo):
            raise ApiError(
                400, "INVALID_ARGUMENT", f"Invalid value for field 'acceleratorTopology': '{topo}'"
            )
        with self.m.lock:
            if name in self.policies:
                raise ApiError(409, "ALREADY_EXISTS", f"The resource '{name}' already exists")
            self.policies[name] = {
                **body, "kind": "compute#resourcePolicy", "id": _id(), "status": "READY",
                "region": f"{BASE}projects/{project}/regions/{region}", "selfLink": BASE + name,
            }  # fmt: skip
            op = self._op(project, f"regions/{region}", "insert", name)
        return self._done(op)

    def get(self, table: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
        with self.m.lock:
            if name not in table:
                raise ApiError(404, "NOT_FOUND", f"The resource '{name}' was not found")
            return dict(table[name])

    def delete_plain(self, table: dict[str, dict[str, Any]], name: str, scope: str) -> dict[str, Any]:
        project = name.split("/")[1]
        with self.m.lock:
            if name not in table:
                raise ApiError(404, "NOT_FOUND", f"The resource '{name}' was not found")
            users = [m for m in self.migs.values()
                     if name in (m.get("_template"), m.get("_policy"))]  # fmt: skip
            if users:
                raise ApiError(400, "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE",
                               f"The resource '{name}' is already being used by '{users[0]['selfLink']}'")  # fmt: skip
            table.pop(name)
            op = self._op(project, scope, "delete", name)
        return self._done(op)

    # -- faults -----------------------------------------------------------------------------------------
    def preempt(self, name: str) -> None:
        """Spot preemption: the instance stops (TERMINATED) and its processes die; a MIG recreates it soon
        after (new address, new host key), as its default REPAIR action does."""
        with self.m.lock:
            rec = self.instance(name)
            rec.status = "TERMINATED"
            self._op(rec.project, f"zones/{rec.zone}", "compute.instances.preempted", name)
        self._power_down(rec)
        if rec.mig:
            self.m._spawn(self._recreate_later, rec, REPAIR_DELAY_S)

    def recreate(self, name: str) -> None:
        """A MIG recreates one instance: same name, new id, new sshd (new port = new IP, new host key)."""
        with self.m.lock:
            rec = self.instance(name)
        self._power_down(rec)
        self._recreate_later(rec, 0.0)

    def _recreate_later(self, rec: InstanceRec, delay: float) -> None:
        with self.m.lock:
            rec.action, rec.status = "RECREATING", "PROVISIONING"
        time.sleep(delay)
        with self.m.lock:
            if self.instances.get(rec.name) is not rec:
                return  # deleted meanwhile
            rec.generation += 1
            rec.id = _id()
            user = self.m.take_user()
        self._boot(rec, None, user)

    def resolve(self, ref: str) -> list[str]:
        """Instance names for a fault: an instance's name (bare or ZONE/NAME), or a MIG's (all its instances)."""
        zone, _, short = ref.rpartition("/")
        with self.m.lock:
            hits = [k for k, r in self.instances.items() if r.short == short and (not zone or r.zone == zone)]
            migs = [
                k for k in self.migs if k.rsplit("/", 1)[1] == short and (not zone or k.split("/")[3] == zone)
            ]
            if len(migs) == 1 and not hits:
                return [r.name for r in self.members(migs[0])]
        return hits if len(hits) == 1 else []

    def stop_all(self) -> None:
        for rec in list(self.instances.values()):
            self._remove(rec, None)
        with self.m.lock:
            self.migs.clear()
            self.templates.clear()
            self.policies.clear()
