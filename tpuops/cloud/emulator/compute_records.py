"""The emulator's Compute Engine records: one TPU VM instance (`InstanceRec`) as the API shows it, and the small
pieces every Compute handler shares (ids, timestamps, list filters, workload-policy checks)."""

from __future__ import annotations

import random
import re
import secrets
import string
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tpuops.cloud.accelerators import accelerator_of, worker_count
from tpuops.cloud.emulator.records import EXTERNAL_IP, INTERNAL_IP, UNREACHABLE_IP, ApiError
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
