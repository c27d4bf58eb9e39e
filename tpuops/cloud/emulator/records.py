"""The emulator's records: API errors and the request log, faults, OS Login profiles, nodes and their
sshd workers."""

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

from tpuops.cloud.emulator.answers import BrokenAnswers
from tpuops.cloud.emulator.sshd import SshdWorker

INTERNAL_IP, EXTERNAL_IP = "127.0.0.1", "127.0.0.2"  # two loopback addresses so --internal-ip is testable
# What a VM without external IPs reports as its internal IP: nobody listens there, as a laptop sees a VPC
# address; its workers answer only through the emulator's IAP forwarder (tpuops/cloud/emulator/iap.py).
UNREACHABLE_IP = "127.0.0.3"
EMULATOR_NS = "tpuops-emulator"  # guest-attribute namespace carrying each worker's sshd port and user


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ApiError(Exception):
    """An error answer in the Google API JSON shape: {"error": {"code", "message", "status"}}."""

    def __init__(self, http: int, status: str, message: str) -> None:
        super().__init__(message)
        self.http, self.status, self.message = http, status, message


@dataclass(frozen=True)
class ApiRequest:
    """One API call as the emulator saw it. `client` and `purpose` are tpuops' request headers
    (x-tpuops-client: which TpuClient of which process; x-tpuops-purpose: "watch" for the recovery watch's
    polls), "" when absent (other clients, operation polls, the Compute/OS Login/IAP routes)."""

    method: str
    path: str
    client: str = ""
    purpose: str = ""

    @property
    def line(self) -> str:
        return f"{self.method} {self.path}"


@dataclass
class Faults:
    """Faults on request: the next N calls answer `unavailable_code`; N creates fail for capacity; the next N
    calls of one API are answered broken (`answers`)."""

    unavailable: int = 0
    unavailable_code: int = 503
    capacity: dict[str, int] = field(default_factory=dict)  # zone (or "*") -> creates still to fail
    oslogin_denied: bool = False  # OS Login answers 403 (the caller lacks roles/compute.osLogin)
    iap_denied: bool = False  # IAP refuses tunnels (4033: no roles/iap.tunnelResourceAccessor)
    answers: BrokenAnswers = field(default_factory=BrokenAnswers)  # HTML, cut-off JSON or no answer at all


@dataclass
class Profile:
    """One account's OS Login profile: its POSIX user (a real Unix user here) and imported keys."""

    account: str
    user: str
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)  # fingerprint -> SshPublicKey JSON

    def to_json(self, project: str) -> dict[str, Any]:
        entry = pwd.getpwnam(self.user) if os.geteuid() == 0 else None
        return {
            "name": self.account,
            "posixAccounts": [
                {
                    "primary": True,
                    "username": self.user,
                    "uid": str(entry.pw_uid if entry else os.geteuid()),
                    "gid": str(entry.pw_gid if entry else os.getegid()),
                    "homeDirectory": entry.pw_dir if entry else str(Path.home()),
                    "shell": "/bin/sh",
                    "systemId": project,
                    "accountId": project,
                    "operatingSystemType": "LINUX",
                }
            ],
            "sshPublicKeys": self.keys,
        }


@dataclass
class NodeRec:
    name: str  # projects/P/locations/Z/nodes/N
    body: dict[str, Any]
    state: str = "CREATING"
    workers: list[SshdWorker] = field(default_factory=list)
    published_keys: list[str] = field(default_factory=list)  # what guest attributes say (may go stale)
    queued_resource: str = ""
    create_time: str = field(default_factory=_now)
    # Held while the workers are powered off (a preemption, a deletion): a teardown hands the workers' users
    # back only after every power-off of them has ended, so a user given to the next VM is never killed late.
    power: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    released: bool = False  # the workers' users were handed back (once, however many teardowns race)

    @property
    def external(self) -> bool:
        """External IPs unless a networkConfig says otherwise (proto3 JSON omits enableExternalIps=false)."""
        return "networkConfig" not in self.body or bool(self.body["networkConfig"].get("enableExternalIps"))

    def hostname(self, worker: int) -> str:
        """The worker's Compute Engine instance name (what IAP tunnels address), as real TPU VMs name them."""
        return f"t1v-n-{uuid.uuid5(uuid.NAMESPACE_URL, self.name).hex[:8]}-w-{worker}"

    def to_json(self) -> dict[str, Any]:
        access = {"accessConfig": {"externalIp": EXTERNAL_IP}} if self.external else {}
        ip = INTERNAL_IP if self.external else UNREACHABLE_IP
        return {
            **self.body,
            "name": self.name,
            "state": self.state,
            "health": "HEALTHY" if self.state == "READY" else "HEALTH_UNSPECIFIED",
            "apiVersion": "V2",
            "createTime": self.create_time,
            "queuedResource": self.queued_resource,
            "networkEndpoints": [{"ipAddress": ip, "port": w.port, **access} for w in self.workers],
        }


def authorized_keys_from_metadata(metadata: dict[str, str]) -> str:
    """GCP's `ssh-keys` metadata ("user:ssh-ed25519 AAAA... comment" per line) -> authorized_keys text."""
    lines = [ln.partition(":")[2].strip() for ln in metadata.get("ssh-keys", "").splitlines() if ":" in ln]
    return "\n".join(ln for ln in lines if ln)


def _expired(key: dict[str, Any]) -> bool:
    exp = int(key.get("expirationTimeUsec", 0) or 0)
    return bool(exp) and exp < time.time() * 1e6


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
    w.drop_connections()
    if os.geteuid() == 0:
        subprocess.run(["pkill", "-KILL", "-u", w.user], check=False, capture_output=True)
