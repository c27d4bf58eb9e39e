"""The SSH identity (gcloud's ~/.ssh/google_compute_engine, made once when absent) and the default login name."""

from __future__ import annotations

import getpass
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from tpuops.cloud.client import Notify
from tpuops.errors import UsageError

DEFAULT_KEY_NAME = "google_compute_engine"  # the key every gcloud user already has


@dataclass(frozen=True)
class Identity:
    path: Path  # the private key
    public: str  # "ssh-ed25519 AAAA... comment"

    @property
    def blob(self) -> str:
        """The key itself (type + base64), without the comment: what matching in metadata compares."""
        return " ".join(self.public.split()[:2])


def default_identity() -> Path:
    return Path.home() / ".ssh" / DEFAULT_KEY_NAME


def default_user() -> str:
    """The local login name, sanitised as gcloud does for metadata keys: lowercase, [a-z0-9_] (others become
    `_`), a leading digit gets a `g`, at most 32 characters."""
    name = re.sub(r"[^a-z0-9_]", "_", getpass.getuser().lower())
    if name[:1].isdigit():
        name = "g" + name
    return name[:32]


def ensure_identity(path: str | None, notify: Notify) -> Identity:
    """An explicit key must exist; the default one is generated (ed25519) the first time, never overwritten."""
    if path:
        key = Path(path).expanduser()
        if not key.is_file():
            raise UsageError(
                f"SSH identity {key} does not exist",
                hint="pass an existing private key with --identity (or `identity` in tpuops.toml)",
            )
        return Identity(key, _public_of(key))
    key = default_identity()
    if not key.exists():
        try:
            _generate(key)
            notify(f"generated SSH key {key} (ed25519), as gcloud would; it is reused from now on")
        except FileExistsError:  # another tpuops made it a moment ago
            pass
    return Identity(key, _public_of(key))


def _public_of(key: Path) -> str:
    pub = Path(f"{key}.pub")
    if pub.is_file():
        return pub.read_text().strip()
    import paramiko  # only when a key has no .pub beside it

    try:
        pkey = paramiko.PKey.from_path(key)
    except (paramiko.SSHException, OSError, ValueError) as e:
        raise UsageError(
            f"cannot read SSH key {key}: {e}", hint="is it an unencrypted OpenSSH private key?"
        ) from None
    return f"{pkey.get_name()} {pkey.get_base64()}"


def _generate(key: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # O_EXCL: two tpuops started at once never overwrite each other's (or anyone's) key.
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    comment = f"{getpass.getuser()}@{socket.gethostname()}"
    Path(f"{key}.pub").write_text(f"{public.decode()} {comment}\n")
