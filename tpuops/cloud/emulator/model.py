"""The emulator's state: nodes backed by real sshd workers, long-running operations, faults."""

from __future__ import annotations

import os
import pwd
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuops.cloud.accelerators import worker_count
from tpuops.cloud.emulator.sshd import SshdWorker, remove_users, start_worker
from tpuops.cloud.emulator.users import UserLeases
from tpuops.errors import UsageError

INTERNAL_IP, EXTERNAL_IP = "127.0.0.1", "127.0.0.2"  # two loopback addresses so --internal-ip is testable
EMULATOR_NS = "tpuops-emulator"  # guest-attribute namespace carrying each worker's sshd port and user
_OP_META = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
_NODE_FIELDS = (
    "acceleratorType",
    "runtimeVersion",
    "schedulingConfig",
    "metadata",
    "labels",
    "description",
    "tags",
    "networkConfig",
)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ApiError(Exception):
    """An error answer in the Google API JSON shape: {"error": {"code", "message", "status"}}."""

    def __init__(self, http: int, status: str, message: str) -> None:
        super().__init__(message)
        self.http, self.status, self.message = http, status, message


@dataclass
class Faults:
    """Faults on request: the next N calls answer `unavailable_code`; N creates fail for capacity."""

    unavailable: int = 0
    unavailable_code: int = 503
    capacity: dict[str, int] = field(default_factory=dict)  # zone (or "*") -> creates still to fail


@dataclass
class NodeRec:
    name: str  # projects/P/locations/Z/nodes/N
    body: dict[str, Any]
    state: str = "CREATING"
    workers: list[SshdWorker] = field(default_factory=list)
    published_keys: list[str] = field(default_factory=list)  # what guest attributes say (may go stale)
    queued_resource: str = ""
    create_time: str = field(default_factory=_now)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.body,
            "name": self.name,
            "state": self.state,
            "health": "HEALTHY" if self.state == "READY" else "HEALTH_UNSPECIFIED",
            "apiVersion": "V2",
            "createTime": self.create_time,
            "queuedResource": self.queued_resource,
            "networkEndpoints": [
                {"ipAddress": INTERNAL_IP, "port": w.port, "accessConfig": {"externalIp": EXTERNAL_IP}}
                for w in self.workers
            ],
        }


def authorized_keys_from_metadata(metadata: dict[str, str]) -> str:
    """GCP's `ssh-keys` metadata ("user:ssh-ed25519 AAAA... comment" per line) -> authorized_keys text."""
    lines = [ln.partition(":")[2].strip() for ln in metadata.get("ssh-keys", "").splitlines() if ":" in ln]
    return "\n".join(ln for ln in lines if ln)


def _trust_local_repos(w: SshdWorker) -> None:
    """Worker users may clone repositories on this machine owned by someone else (a real VM would fetch them
    over the network, where git's ownership check does not apply)."""
    if os.geteuid() != 0:
        return
    cfg = w.home / ".gitconfig"
    cfg.write_text("[safe]\n\tdirectory = *\n")
    entry = pwd.getpwnam(w.user)
    os.chown(cfg, entry.pw_uid, entry.pw_gid)


def _power_off(w: SshdWorker) -> None:
    """What a preemption or deletion does to a worker: sshd and every process of the worker's user die."""
    w.kill_sessions()
    if os.geteuid() == 0:
        subprocess.run(["pkill", "-KILL", "-u", w.user], check=False, capture_output=True)


class Model:
    """All state behind one lock; slow work (starting sshd) runs in threads that finish operations."""

    def __init__(
        self,
        state_dir: Path,
        zones: list[str],
        *,
        authorized_key: str = "",
        user_prefix: str = "tpuops-e",
        create_delay: float = 0.0,
    ) -> None:
        self.state_dir, self.zones = state_dir, zones
        self.authorized_key, self.user_prefix, self.create_delay = authorized_key, user_prefix, create_delay
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeRec] = {}
        self.ops: dict[str, dict[str, Any]] = {}
        self.qrs: dict[str, dict[str, Any]] = {}
        self.faults = Faults()
        self.requests: list[str] = []  # "METHOD /path" of every API call, for tests and `state`
        self.users = UserLeases(user_prefix)
        # Unix users this emulator created: kept (leased) for reuse by later VMs, deleted by stop_all.
        self.created: dict[str, SshdWorker] = {}
        self.spare: list[str] = []
        self._threads: list[threading.Thread] = []

    # -- helpers ----------------------------------------------------------------------------------------
    def check_zone(self, project: str, zone: str) -> str:
        if zone not in self.zones:
            raise ApiError(404, "NOT_FOUND", f"Location projects/{project}/locations/{zone} is not found.")
        return f"projects/{project}/locations/{zone}"

    def node(self, name: str) -> NodeRec:
        rec = self.nodes.get(name)
        if rec is None:
            raise ApiError(404, "NOT_FOUND", f"Resource '{name}' was not found")
        return rec

    def _op(self, parent: str, verb: str, target: str) -> dict[str, Any]:
        op = {
            "name": f"{parent}/operations/operation-{uuid.uuid4().hex[:20]}",
            "metadata": {
                "@type": _OP_META,
                "createTime": _now(),
                "target": target,
                "verb": verb,
                "apiVersion": "v2",
            },
            "done": False,
        }
        self.ops[op["name"]] = op
        return op

    def _finish(
        self, op: dict[str, Any], response: dict[str, Any] | None = None, error: tuple | None = None
    ) -> None:
        with self.lock:
            op["metadata"]["endTime"] = _now()
            if error:
                op["error"] = {"code": error[0], "message": error[1]}
            else:
                op["response"] = response or {"@type": "type.googleapis.com/google.protobuf.Empty"}
            op["done"] = True

    def _spawn(self, fn: Any, *args: Any) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _take_capacity_fault(self, zone: str) -> bool:
        for key in (zone, "*"):
            if self.faults.capacity.get(key, 0) > 0:
                self.faults.capacity[key] -= 1
                return True
        return False

    # -- nodes ------------------------------------------------------------------------------------------
    def create_node(self, parent: str, node_id: str, body: dict[str, Any], queued_resource: str = "") -> dict:
        name = f"{parent}/nodes/{node_id}"
        with self.lock:
            if name in self.nodes:
                raise ApiError(409, "ALREADY_EXISTS", f"Resource '{name}' already exists")
            try:
                count = worker_count(body.get("acceleratorType", ""))
            except UsageError as e:
                raise ApiError(400, "INVALID_ARGUMENT", e.line()) from None
            op = self._op(parent, "create", name)
            zone = parent.rsplit("/", 1)[1]
            if self._take_capacity_fault(zone):
                msg = (
                    f'There is no more capacity in the zone "{zone}"; you can try in another zone where '
                    "Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions)"
                )
                self._finish(op, error=(8, msg))
                return op
            keys = authorized_keys_from_metadata(body.get("metadata", {})) or self.authorized_key
            if not keys:
                raise ApiError(
                    400, "INVALID_ARGUMENT", "no SSH key: set metadata ssh-keys or serve --authorized-key"
                )
            rec = NodeRec(
                name, {k: body[k] for k in _NODE_FIELDS if k in body}, queued_resource=queued_resource
            )
            self.nodes[name] = rec
            users = [self.spare.pop() if self.spare else self.users.take() for _ in range(count)]
        self._spawn(self._boot, rec, op, keys, users)
        return op

    def _boot(self, rec: NodeRec, op: dict[str, Any], keys: str, users: list[str]) -> None:
        base = self.state_dir / "nodes" / rec.name.replace("/", "_")
        workers: list[SshdWorker] = []
        try:
            for i, user in enumerate(users):
                workers.append(start_worker(i, base / f"w{i}", keys, user=user, extra_listen=(EXTERNAL_IP,)))
                if workers[-1].created_user:
                    with self.lock:
                        self.created[user] = workers[-1]
                _trust_local_repos(workers[-1])
        except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
            rec.workers = workers
            self._teardown(rec, None)  # releases the users of the workers that started
            with self.lock:
                for user in users[len(workers) :]:
                    self._release(user)
            self._finish(op, error=(13, f"emulator could not start sshd for {rec.name}: {e}"))
            return
        time.sleep(self.create_delay)
        with self.lock:
            rec.workers = workers
            rec.published_keys = [w.host_public_key for w in workers]
            if rec.state == "CREATING":
                rec.state = "READY"
            self._finish(op, {"@type": "type.googleapis.com/google.cloud.tpu.v2.Node", **rec.to_json()})

    def delete_node(self, name: str) -> dict[str, Any]:
        with self.lock:
            rec = self.node(name)
            rec.state = "DELETING"
            op = self._op(name.rsplit("/nodes/", 1)[0], "delete", name)
        self._spawn(self._teardown, rec, op)
        return op

    def _teardown(self, rec: NodeRec, op: dict[str, Any] | None) -> None:
        for w in rec.workers:
            _power_off(w)
        with self.lock:
            for w in rec.workers:
                self._release(w.user)
            self.nodes.pop(rec.name, None)
        if op is not None:
            self._finish(op)

    def guest_attributes(self, name: str, query_path: str, worker_ids: list[str]) -> dict[str, Any]:
        """As the guest agent publishes them: namespace `hostkeys`, key = key type, value = base64 blob."""
        with self.lock:
            rec = self.node(name)
            out = []
            for i, w in enumerate(rec.workers):
                if worker_ids and str(i) not in worker_ids:
                    continue
                keytype, blob = rec.published_keys[i].split()[:2]
                items = [
                    {"namespace": "hostkeys", "key": keytype, "value": blob},
                    {"namespace": EMULATOR_NS, "key": "ssh-port", "value": str(w.port)},
                    {"namespace": EMULATOR_NS, "key": "ssh-user", "value": w.user},
                ]
                items = [it for it in items if f"{it['namespace']}/{it['key']}".startswith(query_path)]
                out.append({"queryPath": query_path, "queryValue": {"items": items}})
            return {"guestAttributes": out}

    # -- faults -----------------------------------------------------------------------------------------
    def preempt(self, name: str) -> None:
        with self.lock:
            rec = self.node(name)
            rec.state = "PREEMPTED"
            if rec.queued_resource in self.qrs:
                self.qrs[rec.queued_resource]["state"] = {"state": "SUSPENDED"}
        for w in rec.workers:
            _power_off(w)

    def swap_host_key(self, name: str, worker: int) -> None:
        """The worker's sshd gets a new host key while guest attributes keep the old one (a MITM stand-in)."""
        with self.lock:
            rec = self.node(name)
        rec.workers[worker].regenerate_host_key()

    def _release(self, user: str) -> None:
        """Hand a worker's user back (callers hold the lock)."""
        if user in self.created:
            self.spare.append(user)  # still leased: only this emulator may delete it
        else:
            self.users.give_back(user)

    def stop_all(self) -> None:
        """Tear every VM down, then delete the Unix users (and homes) this emulator created."""
        for t in list(self._threads):
            t.join(timeout=30)
        for rec in list(self.nodes.values()):
            self._teardown(rec, None)
        with self.lock:
            made, self.created, self.spare = list(self.created.values()), {}, []
        remove_users(made)
        for w in made:
            self.users.give_back(w.user)
