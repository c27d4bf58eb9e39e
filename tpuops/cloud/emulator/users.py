"""Unix user names for emulated workers, leased with flock so concurrent emulators never share one."""

from __future__ import annotations

import fcntl
import itertools
import os
import tempfile
from pathlib import Path


class UserLeases:
    """Unix user names for emulated workers (prefix + number), each held with flock while in use, so two
    emulators on one machine (a user's and the tests') never hand out the same user and home."""

    def __init__(self, prefix: str, lock_dir: Path | None = None) -> None:
        self.prefix = prefix
        self.lock_dir = lock_dir or Path(tempfile.gettempdir()) / "tpuops-emulator-users"
        self.held: dict[str, int] = {}

    def take(self) -> str:
        for k in itertools.count():
            name = f"{self.prefix}{k}"
            if name not in self.held and self.hold(name):
                return name
        raise AssertionError("unreachable")

    def hold(self, name: str) -> bool:
        """Lease exactly this name; False when another live process holds it."""
        if name in self.held:
            return True
        self.lock_dir.mkdir(mode=0o1777, parents=True, exist_ok=True)
        path = self.lock_dir / f"{name}.lock"
        while True:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            try:
                if path.stat().st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # locked a file its holder removed while letting go: take the new one
        self.held[name] = fd
        return True

    def give_back(self, name: str) -> None:
        """Let go of a name and remove its lock file (removed while still locked, so no one holds a stale one)."""
        fd = self.held.pop(name, None)
        if fd is not None:
            (self.lock_dir / f"{name}.lock").unlink(missing_ok=True)
            os.close(fd)
