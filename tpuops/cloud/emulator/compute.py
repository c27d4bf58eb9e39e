"""The emulator's Compute Engine side: TPU VM instances (one real sshd each), instance templates, workload
policies, MIGs whose instances form a slice, zone/region/global operations, and the faults of a Spot VM
(preempted: TERMINATED) and of a MIG (an instance recreated with a new address and host key)."""

from __future__ import annotations

import random
import re
import secrets
import string
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tpuops.cloud.accelerators import accelerator_of, worker_count
from tpuops.cloud.emulator.records import (
    EMULATOR_NS,
    EXTERNAL_IP,
    INTERNAL_IP,
    UNREACHABLE_IP,
    ApiError,
    _power_off,
    authorized_keys_from_metadata,
)
from tpuops.cloud.emulator.sshd import SshdWorker

BASE = "https://www.googleapis.com/compute/v1/"
_PROJECT = r"/compute/v1/projects/(?P<p>[^/]+)"
_ZONE = _PROJECT + r"/zones/(?P<z>[^/]+)"
_REGION = _PROJECT + r"/regions/(?P<r>[^/]+)"
_GLOBAL = _PROJECT + r"/global"
REPAIR_DELAY_S = 0.3  # a MIG recreates a preempted or failed instance this long after it went down
WORKER_NUMBER = "agent-worker-number"  # instance metadata: the worker index (the key Cloud TPU VMs carry)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime())


def _id() -> str:
    return str(random.getrandbits(63))  # 64-bit ids are JSON strings in the Compute API


def _short(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _items(md: dict[str, str]) -> list[dict[str, str]]:
    return [{"key": k, "value": v} for k, v in md.items()]


@dataclass
class InstanceRec:
    """One TPU VM instance. Duck-types the node record for the model's key logic (`name`'s project,
    `body["metadata"]` as a dict, `workers`)."""

    name: str  # projects/P/zones/Z/instances/N
    body: dict[str, Any]  # the insert body (or the template's properties), metadata as a {key: value} dict
    id: str = field(default_factory=_id)
    status: str = "PROVISIONING"
    workers: list[SshdWorker] = field(default_factory=list)  # exactly one once booted
    published_keys: list[str] = field(default_factory=list)
    mig: str = ""  # projects/P/zones/Z/instanceGroupManagers/M managing it, or ""
    action: str = "CREATING"  # the MIG's currentAction for it
    fingerprint: str = field(default_factory=lambda: secrets.token_urlsafe(8))
    created: str = field(default_factory=_now)
    generation: int = 0  # recreations so far (each gets a new sshd folder: a new host key)
    # Held while its worker is powered off: two power-downs at once (a preemption and a deletion, a deletion
    # and a test's clean-up) hand its user back once, and only after its processes are gone.
    power: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def project(self) -> str:
        return self.name.split("/")[1]

    @property
    def zone(self) -> str:
        return self.name.split("/")[3]

    @property
    def short(self) -> str:
        return self.name.rsplit("/", 1)[1]

    @property
    def external(self) -> bool:
        nics = self.body.get("networkInterfaces") or [{"accessConfigs": [{}]}]
        return bool(nics[0].get("accessConfigs"))

    def to_json(self) -> dict[str, Any]:
        up = self.status == "RUNNING" and self.workers
        nic: dict[str, Any] = {
            "kind": "compute#networkInterface",
            "name": "nic0",
            "network": f"{BASE}projects/{self.project}/global/networks/default",
            "networkIP": INTERNAL_IP if self.external else UNREACHABLE_IP,
        }
        if self.external and up:  # an ephemeral external IP exists only while the VM runs
            nic["accessConfigs"] = [
                {"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT", "name": "External NAT",
                 "natIP": EXTERNAL_IP},
            ]  # fmt: skip
        out = {
            "kind": "compute#instance",
            "id": self.id,
            "name": self.short,
            "status": self.status,
            "creationTimestamp": self.created,
            "zone": f"{BASE}projects/{self.project}/zones/{self.zone}",
            "machineType": f"{BASE}projects/{self.project}/zones/{self.zone}/machineTypes/"
            + _short(self.body.get("machineType", "")),
            "networkInterfaces": [nic],
            "scheduling": self.body.get("scheduling", {}),
            "metadata": {
                "kind": "compute#metadata",
                "fingerprint": self.fingerprint,
                "items": _items(self.body.get("metadata", {})),
            },
            "labels": self.body.get("labels", {}),
            "selfLink": BASE + self.name,
        }
        return out


def _metadata_dict(md: dict[str, Any] | None) -> dict[str, str]:
    return {it["key"]: str(it.get("value", "")) for it in (md or {}).get("items", [])}


class Compute:
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

    # -- managed instance groups ------------------------------------------------------------------------
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


def _suffix() -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=4))


def _resolve_policy(project: str, ref: str) -> str:
    """A workload policy reference (full URL, projects/P/regions/R/..., or regions/R/...) -> its path."""
    m = re.search(r"(?:projects/[^/]+/)?(regions/[^/]+/resourcePolicies/[^/]+)$", ref)
    if not m:
        raise ApiError(
            400, "INVALID_ARGUMENT", f"Invalid value for field 'resourcePolicies.workloadPolicy': '{ref}'"
        )
    return f"projects/{project}/{m[1]}"


def _check_topology(machine: str, policy: dict[str, Any], size: int) -> None:
    """The MIG's VMs must make up the policy's accelerator topology (e.g. 2 x tpu7x-standard-4t = 2x2x2)."""
    topo = policy.get("workloadPolicy", {}).get("acceleratorTopology", "")
    if not topo:
        return
    acc = accelerator_of(_short(machine), topo)
    if not acc or worker_count(acc) != size:
        raise ApiError(
            400, "INVALID_ARGUMENT",
            f"targetSize {size} of {_short(machine)} does not form the accelerator topology {topo}",
        )  # fmt: skip


def _filter(flt: str) -> Any:
    """The subset of Compute's list filter tpuops sends: `name eq "REGEX"` (full match) or `name = "x"`."""
    if not flt.strip():
        return lambda _name: True
    m = re.fullmatch(r'\s*name\s*(eq|=|!=|ne)\s*"?([^"]*)"?\s*', flt)
    if not m:
        raise ApiError(
            400, "INVALID_ARGUMENT", f"Invalid list filter expression '{flt}' (emulator: name only)"
        )
    op, value = m[1], m[2]
    if op == "=":
        return lambda name: name == value
    if op == "!=":
        return lambda name: name != value
    if op == "ne":
        return lambda name: not re.fullmatch(value, name)
    return lambda name: bool(re.fullmatch(value, name))


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
