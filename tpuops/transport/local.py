"""Local transport: each worker is a scratch root on this machine that stands in for a VM's filesystem."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

from tpuops import shell
from tpuops.transport.base import CANCELLED_EXIT, TIMEOUT_EXIT, CmdResult, Kind, LineSink, Worker


class LocalTransport:
    """Runs `sh -c` under <root>/w<k> with HOME pointing there, so `~/...` paths stay inside the scratch root."""

    name = "local"

    def __init__(self, root: Path, num_workers: int = 1, redact: shell.Redactor | None = None) -> None:
        self.root = Path(root)
        self.workers = [Worker(index=k, host="localhost", port=0) for k in range(num_workers)]
        self._redact = redact or shell.Redactor()

    def home(self, worker: int) -> Path:
        return self.root / f"w{worker}"

    def connect(self, worker: int) -> None:
        self.home(worker).mkdir(parents=True, exist_ok=True)

    def resolve(self, worker: int, remote_path: str) -> Path:
        if remote_path == "~":
            return self.home(worker)
        if remote_path.startswith("~/"):
            return self.home(worker) / remote_path[2:]
        return Path(remote_path)

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
        self.connect(worker)
        home = self.home(worker)
        proc_env = {**os.environ, "HOME": str(home)}
        t0 = time.monotonic()
        proc = subprocess.Popen(
            ["/bin/sh", "-c", shell.with_stdin_env(command)],
            cwd=home,
            env=proc_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            process_group=0,  # its own process group, so a timeout can kill the whole group
        )
        out: list[str] = []
        err: list[str] = []
        readers = [
            threading.Thread(target=_pump, args=(proc.stdout, out, worker, on_line), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, err, worker, on_line), daemon=True),
        ]
        for t in readers:
            t.start()
        assert proc.stdin is not None
        try:
            proc.stdin.write(shell.env_script(env or {}))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        error, kind = _wait(proc, t0, timeout, cancel)
        for t in readers:
            t.join(timeout=5)
        code = proc.returncode
        if kind is not None:
            code = TIMEOUT_EXIT if kind is Kind.TIMEOUT else CANCELLED_EXIT
        return CmdResult(
            worker=worker,
            command=self._redact(command),
            exit_code=code,
            stdout=self._redact("".join(out)),
            stderr=self._redact("".join(err)),
            duration_s=time.monotonic() - t0,
            error=error,
            kind=kind,
        )

    def put_bytes(self, worker: int, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        target = self.resolve(worker, remote_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tpuops-tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.fchmod(fd, mode)  # the umask must not widen or narrow what was asked for
            os.write(fd, data)
        finally:
            os.close(fd)
        tmp.replace(target)

    def read_from(self, worker: int, remote_path: str, offset: int, limit: int | None = None) -> bytes | None:
        p = self.resolve(worker, remote_path)
        try:
            with p.open("rb") as f:
                f.seek(offset)
                return f.read(-1 if limit is None else limit)
        except FileNotFoundError:
            return None

    def open_tcp(self, worker: int, port: int) -> socket.socket:
        """A connection to `port` on this machine's loopback (every local worker is this machine)."""
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.settimeout(None)  # a capture's call is quiet for its whole duration
        return sock

    def close(self) -> None:
        pass


def _pump(stream: IO[bytes], sink: list[str], worker: int, on_line: LineSink | None) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        sink.append(line)
        if on_line is not None:
            on_line(worker, line.rstrip("\n"))
    stream.close()


def _wait(
    proc: subprocess.Popen[bytes], t0: float, timeout: float | None, cancel: threading.Event | None
) -> tuple[str | None, Kind | None]:
    """Until the command ends, or its group is killed at `timeout` (from `t0`) or when `cancel` is set:
    (why it was stopped, its kind), (None, None) when it ended by itself."""
    error, kind = None, None
    while proc.poll() is None:
        if timeout is not None and time.monotonic() - t0 > timeout:
            error, kind = f"timed out after {timeout:g}s", Kind.TIMEOUT
        elif cancel is not None and cancel.is_set():
            error, kind = "cancelled: another worker failed", Kind.CANCELLED
        if error:
            _kill_group(proc)
            break
        time.sleep(0.005)
    proc.wait()
    return error, kind


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
