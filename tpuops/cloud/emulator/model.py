"""The emulator's state: nodes backed by real sshd workers, long-running operations, faults."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tpuops.cloud.accelerators import worker_count
from tpuops.cloud.emulator import metadata, ports
from tpuops.cloud.emulator.catalog import Catalog
from tpuops.cloud.emulator.logins import LoginOps
from tpuops.cloud.emulator.records import (
    EMULATOR_NS,
    EXTERNAL_IP,
    ApiError,
    ApiRequest,
    Faults,
    NodeRec,
    Profile,
    _now,
    _power_off,
    _trust_local_repos,
    authorized_keys_from_metadata,
)
from tpuops.cloud.emulator.sshd import SshdWorker, remove_users, start_worker
from tpuops.cloud.emulator.users import UserLeases
from tpuops.errors import UsageError

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
    "multisliceNode",  # set by a multislice queued resource on each of its nodes
)


class Model(LoginOps):
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
        self.requests: list[ApiRequest] = []  # every API call, in order (tests, `state`, `requests`)
        self.users = UserLeases(user_prefix)
        # Unix users this emulator created: kept (leased) for reuse by later VMs, deleted by stop_all.
        self.created: dict[str, SshdWorker] = {}
        self.spare: list[str] = []
        self._threads: list[threading.Thread] = []
        self.projects: dict[str, dict[str, str]] = {}  # project -> common instance metadata
        self.catalog = Catalog()  # the billing catalog's TPU prices
        self.profiles: dict[str, Profile] = {}  # account -> OS Login profile
        self.oslogin_users = UserLeases(f"{user_prefix}o")
        self.oslogin_made: list[
            tuple[str, Path]
        ] = []  # POSIX users of OS Login profiles this emulator created
        self.oslogin_dir = state_dir / "oslogin"  # per POSIX user: the keys OS Login VMs accept
        self.compute: Any = None  # the Compute Engine side (emulator.compute.Compute sets itself here)

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
        self.ops[str(op["name"])] = op
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
            users = [self.take_user() for _ in range(count)]
        self._spawn(self._boot, rec, op, keys, users)
        return op

    def _boot(self, rec: NodeRec, op: dict[str, Any], keys: str, users: list[str]) -> None:
        base = self.state_dir / "nodes" / rec.name.replace("/", "_")
        workers: list[SshdWorker] = []
        try:
            for i, user in enumerate(users):
                workers.append(self.start_sshd(i, base / f"w{i}", keys, user))
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
            self._apply_keys(rec)
            if rec.state == "CREATING":
                rec.state = "READY"
            self._finish(op, {"@type": "type.googleapis.com/google.cloud.tpu.v2.Node", **rec.to_json()})

    def take_user(self) -> str:
        """A worker user: one this emulator made before and got back, else a new lease (callers hold the lock)."""
        return self.spare.pop() if self.spare else self.users.take()

    def start_sshd(self, index: int, directory: Path, keys: str, user: str) -> SshdWorker:
        """One worker's sshd (own host key in `directory`) for `user`, listening on the internal and external IP."""
        worker = start_worker(
            index,
            directory,
            keys,
            user=user,
            extra_listen=(EXTERNAL_IP,),
            allow_users=(f"{self.user_prefix}o*",),
            keys_dir=self.oslogin_dir,
            env={"GCE_METADATA_HOST": metadata.serve(directory).host},  # emulator/metadata.py
        )
        if worker.created_user:
            with self.lock:
                self.created[user] = worker
        _trust_local_repos(worker)
        return worker

    def delete_node(self, name: str) -> dict[str, Any]:
        with self.lock:
            rec = self.node(name)
            rec.state = "DELETING"
            op = self._op(name.rsplit("/nodes/", 1)[0], "delete", name)
        self._spawn(self._teardown, rec, op)
        return op

    def stop_node(self, name: str) -> dict[str, Any]:
        """nodes.stop: STOPPING, every worker's processes gone, then STOPPED (the node and its workers' homes
        stay)."""
        with self.lock:
            rec = self.node(name)
            rec.state = "STOPPING"
            op = self._op(name.rsplit("/nodes/", 1)[0], "stop", name)

        def stop() -> None:
            with rec.power:
                for w in rec.workers:
                    _power_off(w)
                with self.lock:
                    if not rec.released:
                        rec.state = "STOPPED"
            self._finish(op)

        self._spawn(stop)
        return op

    def _teardown(self, rec: NodeRec, op: dict[str, Any] | None) -> None:
        with rec.power:  # after any preemption's power-off of these workers has ended
            with self.lock:
                first = not rec.released
            # A deletion racing a test's clean-up: the users go back once, and a second power-off never runs
            # (its pkill would reach the next VM that got these users back).
            if first:
                for w in rec.workers:
                    _power_off(w)
            with self.lock:
                if first:
                    rec.released = True
                    for w in rec.workers:
                        self._release(w.user)
                if self.nodes.get(rec.name) is rec:  # not a new VM of the same name
                    self.nodes.pop(rec.name)
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
                    {"namespace": "guestInventory", "key": "hostname", "value": rec.hostname(i)},
                    {"namespace": EMULATOR_NS, "key": "ssh-port", "value": str(w.port)},
                    *ports.attributes(rec.name, i),  # a filtered port's route to worker 0 (emulator/ports.py)
                    *metadata.guest_items(w.state_dir),  # what the worker put on its metadata server
                ]
                if not self.oslogin_on(rec):  # with OS Login the login name is the profile's POSIX user
                    items.append({"namespace": EMULATOR_NS, "key": "ssh-user", "value": w.user})
                items = [it for it in items if f"{it['namespace']}/{it['key']}".startswith(query_path)]
                out.append({"queryPath": query_path, "queryValue": {"items": items}})
            return {"guestAttributes": out}

    def update_node(self, name: str, body: dict[str, Any], mask: list[str]) -> dict[str, Any]:
        """nodes.patch: the masked fields are replaced; a metadata change reaches the workers' keys at once."""
        with self.lock:
            rec = self.node(name)
            unknown = [f for f in mask if f not in _NODE_FIELDS]
            if not mask or unknown:
                raise ApiError(400, "INVALID_ARGUMENT", f"updateMask {','.join(mask)!r}: unsupported field")
            for f in mask:
                if f in body:
                    rec.body[f] = body[f]
                else:
                    rec.body.pop(f, None)
            op = self._op(name.rsplit("/nodes/", 1)[0], "update", name)
            self._apply_keys(rec)
            self._finish(op, {"@type": "type.googleapis.com/google.cloud.tpu.v2.Node", **rec.to_json()})
            return op

    # -- keys: metadata and OS Login ----------------------------------------------------------------------
    def oslogin_on(self, rec: NodeRec) -> bool:
        """The node's `enable-oslogin` when set, else its project's (gcloud and the guest agent agree)."""
        project = rec.name.split("/")[1]
        value = rec.body.get("metadata", {}).get(
            "enable-oslogin", self.projects.get(project, {}).get("enable-oslogin", "")
        )
        return value.strip().upper() == "TRUE"

    def _apply_keys(self, rec: NodeRec) -> None:
        """What the guest agent does: with OS Login, metadata keys are ignored (sshd asks OS Login, here the
        files under oslogin_dir); without, the worker user's authorized_keys are the `ssh-keys` lines."""
        keys = "" if self.oslogin_on(rec) else self._metadata_keys(rec)
        for w in rec.workers:
            w.write_authorized_keys(keys)

    def _metadata_keys(self, rec: NodeRec) -> str:
        project = rec.name.split("/")[1]
        md = rec.body.get("metadata", {})
        lines = authorized_keys_from_metadata(md)
        if md.get("block-project-ssh-keys", "").upper() != "TRUE":
            lines = "\n".join(
                x for x in (lines, authorized_keys_from_metadata(self.projects.get(project, {}))) if x
            )
        return lines or self.authorized_key

    def set_project_metadata(self, project: str, metadata: dict[str, str]) -> None:
        with self.lock:
            self.projects.setdefault(project, {}).update(metadata)
            for rec in [*self.nodes.values(), *(self.compute.instances.values() if self.compute else [])]:
                if rec.name.split("/")[1] == project and rec.workers:
                    self._apply_keys(rec)

    # -- faults -----------------------------------------------------------------------------------------
    def preempt(self, name: str) -> None:
        with self.lock:
            rec = self.node(name)
        # The state and the power-off under the node's power lock: a deletion that sees PREEMPTED waits for
        # this power-off before it hands the workers' users to the next VM.
        with rec.power:
            with self.lock:
                if rec.released:
                    return  # deleted meanwhile
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
            if user not in self.spare:  # never twice: two VMs would share one user
                self.spare.append(user)  # still leased: only this emulator may delete it
        else:
            self.users.give_back(user)

    def stop_all(self) -> None:
        """Tear every VM down, then delete the Unix users (and homes) this emulator created."""
        for t in list(self._threads):
            t.join(timeout=30)
        if self.compute is not None:
            self.compute.stop_all()
        for rec in list(self.nodes.values()):
            self._teardown(rec, None)
        with self.lock:
            made, self.created, self.spare = list(self.created.values()), {}, []
        remove_users(made)
        for w in made:
            self.users.give_back(w.user)
        from tpuops.cloud.emulator.sshd import delete_user

        for name, home in self.oslogin_made:
            delete_user(name, home)
            self.oslogin_users.give_back(name)
        self.oslogin_made = []
        metadata.stop_under(self.state_dir)
