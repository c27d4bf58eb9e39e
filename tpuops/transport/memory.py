"""An in-memory transport for tests of the executor's rules: scripted results, an unexpected command fails.

As invoke's MockContext: each command a worker is asked to run must match an expectation given up front
(a regular expression searched in the command, optionally for one worker), which answers with a scripted
CmdResult; anything else raises UnexpectedCommandError, so a test cannot pass on a command it did not foresee.
Files live in a dict per worker. Nothing leaves the process and nothing sleeps.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tpuops import shell
from tpuops.errors import ConnectError
from tpuops.transport.base import CANCELLED_EXIT, CmdResult, Kind, LineSink, Worker

HOLD_S = 10.0  # a held command that nobody cancels fails the test after this long (a deadline, not a sleep)


class UnexpectedCommandError(AssertionError):
    """A command no expectation matches (the test did not foresee it)."""


@dataclass
class Expect:
    """Commands matching `pattern` (re.search) on `worker` (None: any) get `answer`; `times` None = always."""

    pattern: str
    answer: Callable[[int, str], CmdResult]
    worker: int | None = None
    times: int | None = None
    hold: bool = False  # the command runs until the executor cancels it (fail-fast), at most HOLD_S
    used: int = 0

    def matches(self, worker: int, command: str) -> bool:
        if self.worker is not None and self.worker != worker:
            return False
        if self.times is not None and self.used >= self.times:
            return False
        return re.search(self.pattern, command) is not None


@dataclass
class MemoryTransport:
    """`workers` workers whose commands answer from `expectations`, in the order they were added."""

    num_workers: int = 1
    name: str = "memory"
    expectations: list[Expect] = field(default_factory=list)
    files: dict[int, dict[str, bytes]] = field(default_factory=dict)
    unreachable: dict[int, str] = field(default_factory=dict)  # worker -> why connect() fails
    calls: list[tuple[int, str]] = field(default_factory=list)  # (worker, command), in the order run
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.workers = [Worker(k, host=f"mem{k}") for k in range(self.num_workers)]

    def expect(
        self,
        pattern: str,
        *,
        worker: int | None = None,
        exit_code: int = 0,
        stdout: str = "",
        stderr: str = "",
        kind: Kind | None = None,
        error: str | None = None,
        times: int | None = None,
        hold: bool = False,
    ) -> MemoryTransport:
        """Script the answer to commands matching `pattern`; returns self (expectations chain). With `hold`
        the command runs until the executor cancels it (another worker failed) and answers as cancelled."""

        def answer(w: int, command: str) -> CmdResult:
            return CmdResult(w, command, exit_code, stdout, stderr, error=error, kind=kind)

        self.expectations.append(Expect(pattern, answer, worker, times, hold))
        return self

    def answer(
        self, pattern: str, fn: Callable[[int, str], CmdResult], *, worker: int | None = None
    ) -> MemoryTransport:
        """Script a computed answer (a function of the worker and the command)."""
        self.expectations.append(Expect(pattern, fn, worker))
        return self

    def ran(self, pattern: str, worker: int | None = None) -> list[tuple[int, str]]:
        """The calls whose command matches `pattern` (on `worker`)."""
        return [(w, c) for w, c in self.calls if re.search(pattern, c) and worker in (None, w)]

    # ---- the Transport protocol ----
    def connect(self, worker: int) -> None:
        if worker in self.unreachable:
            raise ConnectError(f"w{worker}: {self.unreachable[worker]}")

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
        with self.lock:
            self.calls.append((worker, command))
            if cancel is not None and cancel.is_set():  # fail-fast: another worker failed first
                return CmdResult(worker, command, CANCELLED_EXIT, error="cancelled: another worker failed",
                                 kind=Kind.CANCELLED)  # fmt: skip
            own = command.split(shell.STEP_BEGINS + "\n", 1)[-1]  # a step's own commands, not the run's guard
            found = next((e for e in self.expectations if e.matches(worker, own)), None)
            if found is None:
                raise UnexpectedCommandError(
                    f"w{worker} was asked to run a command no expectation matches:\n{command}"
                )
            found.used += 1
        if found.hold:
            if cancel is None or not cancel.wait(HOLD_S):
                raise AssertionError(f"w{worker}: a held command was not cancelled within {HOLD_S:g}s")
            return CmdResult(worker, command, CANCELLED_EXIT, error="cancelled: another worker failed",
                             kind=Kind.CANCELLED)  # fmt: skip
        result = found.answer(worker, command)
        if on_line:
            for line in result.stdout.splitlines():
                on_line(worker, line)
        return result

    def put_bytes(self, worker: int, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        with self.lock:
            self.files.setdefault(worker, {})[remote_path] = data

    def read_from(self, worker: int, remote_path: str, offset: int, limit: int | None = None) -> bytes | None:
        with self.lock:
            data = self.files.get(worker, {}).get(remote_path)
        if data is None:
            return None
        return data[offset:] if limit is None else data[offset : offset + limit]

    def close(self) -> None:
        pass
