"""Host-key verification: tpuops' own known_hosts file and pinned SHA256 fingerprints; never auto-add."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import paramiko

from tpuops.errors import HostKeyError


def fingerprint(key: paramiko.PKey) -> str:
    """The OpenSSH form: `SHA256:` + unpadded base64 of the SHA-256 of the key blob."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def fingerprint_of_public_line(line: str) -> str:
    """Fingerprint of an OpenSSH public key line (`ssh-ed25519 AAAA... comment`)."""
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class PinnedKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Accepts exactly the pinned fingerprints for this worker; anything else is an error naming both."""

    def __init__(self, label: str, pins: set[str]) -> None:
        self.label = label
        self.pins = pins

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        got = fingerprint(key)
        if got not in self.pins:
            raise HostKeyError(
                f"host key of {self.label} ({hostname}) is {got}, expected {', '.join(sorted(self.pins))}",
                hint="the key changed or this is another machine; re-check the VM before trusting it",
            )
        client.get_host_keys().add(hostname, key.get_name(), key)  # in memory only, for this session


class RejectWithAdvice(paramiko.MissingHostKeyPolicy):
    """paramiko's RejectPolicy, but the error says how to pin the key after checking it."""

    def __init__(self, label: str, known_hosts: Path) -> None:
        self.label = label
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostKeyError(
            f"unknown host key for {self.label} ({hostname}): {fingerprint(key)}",
            hint=f"verify it, then pass --hostkey {fingerprint(key)} or add it to {self.known_hosts}",
        )


def add_known_host(known_hosts: Path, host: str, port: int, public_line: str) -> None:
    """Record a verified public key line in tpuops' known_hosts (used after a fingerprint was checked)."""
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    keytype, blob = public_line.split()[:2]
    name = known_hosts_name(host, port)
    existing = known_hosts.read_text().splitlines() if known_hosts.exists() else []
    kept = [ln for ln in existing if not (ln.split(" ")[0] == name and ln.split(" ")[1] == keytype)]
    known_hosts.write_text("\n".join([*kept, f"{name} {keytype} {blob}"]) + "\n")
