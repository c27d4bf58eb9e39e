"""The Transport protocol, the per-command result and the per-worker fan-out result."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

# Exit code reported for a command that ran past its timeout (as coreutils' `timeout` does).
TIMEOUT_EXIT = 124
# Exit code reported for a command that was cancelled because another worker failed (fail-fast).
CANCELLED_EXIT = 130

LineSink = Callable[[int, str], None]  # (worker index, line) -> None


@dataclass(frozen=True)
class Worker:
    """One TPU worker (or one local scratch root standing in for it)."""

    index: int
    host: str = "localhost"
    port: int = 22
    user: str | None = None
    hostkey: str | None = None  # pinned "SHA256:..." fingerprint, when known
    internal_host: str | None = (
        None  # the address other workers reach it at (the coordinator's, for worker 0)
    )
    slice_index: int = 0  # its slice on a multislice VM (workers are numbered across slices, slice 0 first)
    # The address this worker reaches worker 0 at, where it is not worker 0's internal_host (the emulator's
    # route for a filtered port, cloud/emulator/ports.py).
    peer_host: str | None = None

    @property
    def label(self) -> str:
        return f"w{self.index}"

    @property
    def address(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.host}:{self.port}"


@dataclass(frozen=True)
class Prepared:
    """What a transport learns at its first connection (a VM's key authorised, tunnels opened)."""

    workers: list[Worker]
    identity: Path | None = None
    close: Callable[[], None] | None = None  # stops what prepare started (IAP tunnels)
    auth_grace_s: float = 0.0  # a key just added: retry refused logins this long while the VM applies it


class Kind(StrEnum):
    """How a command (or a follow) ended: the one typed answer, never re-read from its error text."""

    OK = "ok"  # ran and exited 0 (a follow: the job's exit file was read, see `job_exit`)
    EXIT = "exit"  # ran and exited non-zero (`exit_code`)
    TIMEOUT = "timeout"  # ran past its timeout and was stopped (exit_code 124, as coreutils' timeout)
    CANCELLED = "cancelled"  # stopped because another worker failed (fail-fast), exit_code 130
    CONNECT = "connect"  # the connection was lost (exit_code 255)
    HUNG = "hung"  # a follow saw no new step line within the hang limit (exit_code 124)
    ABORTED = "aborted"  # a follow stopped from outside: the VM is gone (exit_code 130)
    DIED = "died"  # a follow found the job's process gone without an exit file (exit_code 1)
    MISSING = "missing"  # a fetch found no log on the worker (exit_code 1)
    DETACHED = "detached"  # a follow stopped by Ctrl-C: the job goes on (exit_code 130)


@dataclass(frozen=True)
class CmdResult:
    """What one command did on one worker. `command` is already redacted.

    `kind` says how it ended; when not given it follows from the exit code (OK for 0, EXIT otherwise):
    every other kind is given by the transport or the follower that saw it happen, with `error` in words
    for people (never parsed)."""

    worker: int
    command: str
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    error: str | None = None  # why it did not run to its end (connect, timeout, cancelled...), in words
    kind: Kind | None = None  # None: from exit_code (filled in at construction, never None afterwards)
    job_exit: int | None = None  # a follow that ended at the job's exit file: the job's exit code
    offset: int | None = None  # a follow: bytes of the log read when it ended
    job_notes: tuple[str, ...] = ()  # a follow: the exit file's notes (`stopped`, `nospace`: logs/events.py)

    def __post_init__(self) -> None:
        if self.kind is None:
            kind = Kind.OK if self.exit_code == 0 and self.error is None else Kind.EXIT
            object.__setattr__(self, "kind", kind)

    @property
    def ok(self) -> bool:
        return self.kind is Kind.OK

    @property
    def timed_out(self) -> bool:
        return self.kind is Kind.TIMEOUT

    @property
    def interrupted(self) -> bool:
        """It did not run to its own end (timeout, cancel, lost connection, hang, abort...)."""
        return self.kind not in (Kind.OK, Kind.EXIT)


class Transport(Protocol):
    """Runs commands and moves files on workers. Implementations: LocalTransport, SshTransport."""

    name: str
    workers: list[Worker]

    def connect(self, worker: int) -> None:
        """Open (or check) the connection to one worker; raises ConnectError/HostKeyError."""

    def run(
        self,
        worker: int,
        command: str,
        *,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        on_line: LineSink | None = None,
        cancel: threading.Event | None = None,
    ) -> CmdResult:
        """Run a POSIX sh command; env values go over stdin, never on the command line."""

    def put_bytes(self, worker: int, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        """Write a file atomically with `mode` set before any content is written."""

    def read_from(self, worker: int, remote_path: str, offset: int, limit: int | None = None) -> bytes | None:
        """Bytes of a file from `offset` on, at most `limit` of them (None if it does not exist)."""

    def close(self) -> None:
        """Close every connection."""
