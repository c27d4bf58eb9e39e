"""The emulator's OS Login and IAP: an account's imported keys and POSIX user (users.importSshPublicKey,
getLoginProfile), and where an IAP tunnel to INSTANCE:22 lands (that worker's sshd)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from tpuops.cloud.emulator.records import INTERNAL_IP, ApiError, Faults, NodeRec, Profile, _expired
from tpuops.cloud.emulator.users import UserLeases
from tpuops.transport.hostkeys import fingerprint_of_public_line


class LoginOps:
    """The OS Login and IAP half of the emulator's `Model` (a mixin: it shares the model's lock and state)."""

    lock: threading.RLock
    faults: Faults
    profiles: dict[str, Profile]
    oslogin_users: UserLeases
    oslogin_made: list[tuple[str, Path]]
    oslogin_dir: Path
    nodes: dict[str, NodeRec]
    compute: Any

    def import_ssh_key(self, account: str, body: dict[str, Any], project: str) -> dict[str, Any]:
        """users.importSshPublicKey: the key joins the account's profile, whose POSIX user is created once."""
        if self.faults.oslogin_denied:
            raise ApiError(
                403, "PERMISSION_DENIED", f"The caller does not have permission on users/{account}"
            )
        key = str(body.get("key", "")).strip()
        if len(key.split()) < 2:
            raise ApiError(400, "INVALID_ARGUMENT", "sshPublicKey.key must be an OpenSSH public key")
        with self.lock:
            prof = self.profiles.get(account)
            if prof is None:
                prof = Profile(account, self.oslogin_users.take())
                if os.geteuid() == 0:
                    from tpuops.cloud.emulator.sshd import ensure_user, reset_home

                    home = Path("/home") / prof.user
                    if ensure_user(prof.user, home):
                        self.oslogin_made.append((prof.user, home))  # deleted by stop_all
                    reset_home(prof.user, home)
                self.profiles[account] = prof
            fp = fingerprint_of_public_line(key).removeprefix("SHA256:")
            prof.keys[fp] = {
                "key": key,
                "fingerprint": fp,
                "name": f"users/{account}/sshPublicKeys/{fp}",
                **(
                    {"expirationTimeUsec": str(body["expirationTimeUsec"])}
                    if body.get("expirationTimeUsec")
                    else {}
                ),
            }
            self.oslogin_dir.mkdir(parents=True, exist_ok=True)
            live = [k["key"] for k in prof.keys.values() if not _expired(k)]
            (self.oslogin_dir / prof.user).write_text("\n".join(live) + "\n")
            return {"loginProfile": prof.to_json(project)}

    def login_profile(self, account: str, project: str) -> dict[str, Any]:
        with self.lock:
            prof = self.profiles.get(account)
            return prof.to_json(project) if prof else {"name": account}

    def iap_target(self, project: str, zone: str, instance: str, port: int) -> tuple[str, int]:
        """Where IAP forwards a tunnel to INSTANCE:PORT: that worker's sshd (only port 22 is open)."""
        if self.faults.iap_denied:
            raise ApiError(403, "PERMISSION_DENIED", "4033: 'not authorized'")
        with self.lock:
            for rec in self.nodes.values():
                if rec.name.split("/")[1] != project or rec.name.split("/")[3] != zone:
                    continue
                for i, w in enumerate(rec.workers):
                    if rec.hostname(i) == instance:
                        if port != 22:
                            raise ApiError(400, "FAILED_PRECONDITION", "4003: 'failed to connect to backend'")
                        return INTERNAL_IP, w.port
            inst = (
                self.compute.instances.get(f"projects/{project}/zones/{zone}/instances/{instance}")
                if self.compute
                else None
            )
            if inst is not None and inst.workers:
                if port != 22:
                    raise ApiError(400, "FAILED_PRECONDITION", "4003: 'failed to connect to backend'")
                return INTERNAL_IP, inst.workers[0].port
        raise ApiError(404, "NOT_FOUND", f"4047: instance {instance} not found in {project}/{zone}")
