"""SSH transport: one persistent paramiko connection per worker, verified host keys, env over stdin."""

from __future__ import annotations

import io
import select
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import paramiko

from tpuops import shell
from tpuops.errors import ConnectError, HostKeyError
from tpuops.transport.base import CANCELLED_EXIT, TIMEOUT_EXIT, CmdResult, Kind, LineSink, Prepared, Worker
from tpuops.transport.hostkeys import PinnedKeyPolicy, RejectWithAdvice, fingerprint, known_hosts_name
from tpuops.transport.retry import Backoff, retry

EOF_GRACE_S = 1.0  # how long output may still come after the exit status, with no end of file yet


class SshTransport:
    """All workers of a VM over SSH. Connections open lazily, once, and stay open for the whole SOP."""

    name = "ssh"

    def __init__(
        self,
        workers: list[Worker],
        *,
        known_hosts: Path,
        identity: Path | None = None,
        connect_timeout: float = 10.0,
        connect_retries: int = 3,
        redact: shell.Redactor | None = None,
        prepare: Callable[[], Prepared] | None = None,
    ) -> None:
        """`prepare`, when given, runs once before the first connection and replaces workers and identity
        (a VM's key is authorised and its tunnels opened only when something really connects)."""
        self.workers = workers
        self.known_hosts = known_hosts
        self.identity = identity
        self.connect_timeout = connect_timeout
        self.connect_retries = connect_retries
        self._redact = redact or shell.Redactor()
        self._clients: dict[int, paramiko.SSHClient] = {}
        self._sftps: dict[int, paramiko.SFTPClient] = {}
        self._homes: dict[int, str] = {}
        self._locks = {w.index: threading.Lock() for w in workers}
        self._prepare = prepare
        self._prepare_lock = threading.Lock()
        self._prepare_error: Exception | None = None
        self._on_close: Callable[[], None] | None = None
        self._auth_deadline = 0.0

    # -- connections ---------------------------------------------------------------------------------
    def connect(self, worker: int) -> None:
        self._client(worker)

    def _prepared(self) -> None:
        with self._prepare_lock:
            if self._prepare_error is not None:
                raise self._prepare_error
            if self._prepare is None:
                return
            try:
                ready = self._prepare()
            except Exception as e:
                self._prepare_error = e  # every worker's connect reports the same cause, once computed
                raise
            self._prepare = None
            self.workers = ready.workers
            self.identity = ready.identity or self.identity
            self._on_close = ready.close
            self._auth_deadline = time.monotonic() + ready.auth_grace_s

    def _client(self, worker: int) -> paramiko.SSHClient:
        self._prepared()
        with self._locks[worker]:
            client = self._clients.get(worker)
            live = client.get_transport() if client is not None else None
            if client is not None and live is not None and live.is_active():
                return client
            client = self._open(self.workers[worker])
            self._clients[worker] = client
            return client

    def _open(self, w: Worker) -> paramiko.SSHClient:
        """A connection to `w`: network failures tried `connect_retries` times with backoff; a refused login
        tried again every 2 s while a key just added is still being applied (`auth_grace_s`)."""

        def connect() -> paramiko.SSHClient:
            return retry(
                lambda: self._connect_once(w),
                on=(OSError, paramiko.SSHException, EOFError),
                backoff=Backoff(0.5, 2.0, 8.0),
                tries=self.connect_retries,
            )

        try:
            return retry(
                connect, on=(_LoginRefusedError,), backoff=Backoff(2.0, 1.0, 2.0), until=self._auth_deadline
            )
        except _LoginRefusedError as e:
            raise ConnectError(
                f"{w.label} ({w.address}) refused authentication: {e}",
                hint="check --user and --identity (or your ssh-agent)",
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise ConnectError(
                f"cannot connect to {w.label} ({w.address}) after {self.connect_retries} tries: {e}",
                hint="is the VM READY and the address reachable from here? (--internal-ip on the same network)",
            ) from None

    def _connect_once(self, w: Worker) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if w.hostkey:
            # A pinned fingerprint overrides the known_hosts file for this worker.
            client.set_missing_host_key_policy(PinnedKeyPolicy(w.label, {w.hostkey}))
        else:
            if self.known_hosts.exists():
                client.load_host_keys(str(self.known_hosts))
            client.set_missing_host_key_policy(RejectWithAdvice(w.label, self.known_hosts))
        try:
            # Without TCP_NODELAY, Nagle + delayed ACKs add ~40 ms to every other channel open.
            sock = socket.create_connection((w.host, w.port), timeout=self.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client.connect(
                w.host,
                sock=sock,
                port=w.port,
                username=w.user,
                key_filename=str(self.identity) if self.identity else None,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                allow_agent=self.identity is None,
                look_for_keys=self.identity is None,
            )
            return client
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as e:
            client.close()
            raise HostKeyError(
                f"host key of {w.label} ({w.address}) changed: got {fingerprint(e.key)}, "
                f"known_hosts has {fingerprint(e.expected_key)}",
                hint=f"if the VM was recreated, remove {known_hosts_name(w.host, w.port)} from "
                f"{self.known_hosts} after checking the new key",
            ) from None
        except paramiko.AuthenticationException as e:
            client.close()
            raise _LoginRefusedError(str(e)) from None
        except BaseException:
            client.close()
            raise

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self._sftps.clear()
        if self._on_close is not None:
            self._on_close()
            self._on_close = None

    # -- commands ------------------------------------------------------------------------------------
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
        t0 = time.monotonic()
        redacted = self._redact(command)
        try:
            connection = self._client(worker).get_transport()
            if connection is None:
                raise paramiko.SSHException("the connection has no transport")
            chan = connection.open_channel("session", timeout=self.connect_timeout)
            chan.exec_command(shell.with_stdin_env(command))
            chan.sendall(shell.env_script(env or {}))
            chan.shutdown_write()
        except (OSError, paramiko.SSHException, EOFError) as e:
            self._drop(worker)
            return CmdResult(worker, redacted, 255, error=f"connection lost: {e}", kind=Kind.CONNECT)
        out, err = _Lines(worker, on_line), _Lines(worker, on_line)
        error, kind = _pump(chan, out, err, t0, timeout, cancel)
        codes = {Kind.TIMEOUT: TIMEOUT_EXIT, Kind.CANCELLED: CANCELLED_EXIT, Kind.CONNECT: 255}
        code = chan.recv_exit_status() if kind is None else codes[kind]
        if kind is None and code == -1:  # paramiko's "closed without an exit status"
            live = chan.get_transport()
            if live is not None:  # a dying transport closes its channels first, then goes inactive: a moment
                live.join(0.1)
            if live is not None and live.is_active():  # the shell died of a signal (OpenSSH: exit-signal)
                error, kind, code = "the command was killed on the worker (no exit status)", Kind.EXIT, 255
            else:
                error, kind, code = _lost(live), Kind.CONNECT, 255
        chan.close()
        return CmdResult(
            worker=worker,
            command=redacted,
            exit_code=code,
            stdout=self._redact(out.text()),
            stderr=self._redact(err.text()),
            duration_s=time.monotonic() - t0,
            error=error,
            kind=kind,
        )

    def _drop(self, worker: int) -> None:
        self._sftps.pop(worker, None)
        client = self._clients.pop(worker, None)
        if client is not None:
            client.close()

    def open_tcp(self, worker: int, port: int) -> paramiko.Channel:
        """A connection to `port` on the worker's own loopback, through its SSH connection (direct-tcpip): a
        service that listens only there (the job's profiler server) is reached without opening any port."""
        connection = self._client(worker).get_transport()
        if connection is None or not connection.is_active():
            raise ConnectionError(f"connection to {self.workers[worker].label} lost")
        try:
            return connection.open_channel(
                "direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0), timeout=self.connect_timeout
            )
        except paramiko.ChannelException as e:
            raise ConnectionRefusedError(f"port {port} on {self.workers[worker].label}: {e.text}") from None
        except (paramiko.SSHException, EOFError) as e:
            raise ConnectionError(f"{self.workers[worker].label}: {e or type(e).__name__}") from None

    # -- files ---------------------------------------------------------------------------------------
    def _sftp(self, worker: int) -> paramiko.SFTPClient:
        """One SFTP session per worker, kept open (follow polls through it twice a second)."""
        sftp = self._sftps.get(worker)
        if sftp is None or sftp.sock.closed:
            sftp = self._client(worker).open_sftp()
            self._sftps[worker] = sftp
        return sftp

    def _path(self, worker: int, p: str) -> str:
        """`~/x` -> an absolute path under the login's $HOME (asked once: SFTP servers differ in where they start)."""
        if not (p == "~" or p.startswith("~/")):
            return p
        if worker not in self._homes:
            r = self.run(worker, 'printf %s "$HOME"')
            if not r.ok or not r.stdout.startswith("/"):
                raise ConnectError(
                    f"cannot read $HOME on {self.workers[worker].label}: {r.error or r.stderr}"
                )
            self._homes[worker] = r.stdout
        return self._homes[worker] + p[1:]

    def put_bytes(self, worker: int, data: bytes, remote_path: str, *, mode: int = 0o600) -> None:
        path = self._path(worker, remote_path)
        parent, _, name = path.rpartition("/")
        tmp = f"{parent}/.{name}.tpuops-tmp"
        sftp = self._sftp(worker)
        _makedirs(sftp, parent)
        with sftp.open(tmp, "wb") as f:
            f.chmod(mode)  # before any byte of content is written
            f.write(data)
        sftp.posix_rename(tmp, path)

    def read_from(self, worker: int, remote_path: str, offset: int, limit: int | None = None) -> bytes | None:
        path = self._path(worker, remote_path)
        try:
            with self._sftp(worker).open(path, "rb") as f:
                f.seek(offset)
                buf = io.BytesIO()
                while (left := (1 << 20) if limit is None else min(1 << 20, limit - buf.tell())) > 0:
                    if not (chunk := f.read(left)):
                        break
                    buf.write(chunk)
                return buf.getvalue()
        except FileNotFoundError:
            return None
        except (OSError, paramiko.SSHException, EOFError) as e:
            self._drop(worker)  # a reader retries on ConnectError (a changed host key is HostKeyError: never)
            raise ConnectError(
                f"connection to {self.workers[worker].label} lost: {e or type(e).__name__}"
            ) from e


def _pump(
    chan: paramiko.Channel,
    out: _Lines,
    err: _Lines,
    t0: float,
    timeout: float | None,
    cancel: threading.Event | None,
) -> tuple[str | None, Kind | None]:
    """The command's output into `out` and `err` until it exits, or until the channel is closed at `timeout`
    (from `t0`), when `cancel` is set or when the connection is lost: (why it stopped, its kind), (None, None)
    when it exited by itself."""
    error, kind = None, None
    while True:
        if chan.recv_ready():
            out.feed(chan.recv(65536))
            continue
        if chan.recv_stderr_ready():
            err.feed(chan.recv_stderr(65536))
            continue
        if chan.exit_status_ready():
            break
        if timeout is not None and time.monotonic() - t0 > timeout:
            error, kind = f"timed out after {timeout:g}s", Kind.TIMEOUT
        elif cancel is not None and cancel.is_set():
            error, kind = "cancelled: another worker failed", Kind.CANCELLED
        elif chan.closed or not chan.get_transport().is_active():
            # The server sends the exit status, then closes: both may have arrived since the check above
            # (a closed channel's status is always ready; -1 when none came: `run` tells those apart).
            if chan.exit_status_ready():
                break
            error, kind = _lost(chan.get_transport()), Kind.CONNECT
        if error:
            chan.close()
            break
        select.select([chan], [], [], 0.005)
    _drain(chan, out, err, wait=error is None)
    return error, kind


def _drain(chan: paramiko.Channel, out: _Lines, err: _Lines, *, wait: bool) -> None:
    """What is left of the output once the command exited. sshd sends the exit status when the shell exits, which
    can be before the last of its stderr (or stdout) pipe is read and sent: with `wait`, read on until the server's
    end of file, or until EOF_GRACE_S passed without data (a background child that kept the pipes open)."""
    quiet_since = time.monotonic()
    while True:
        got = False
        while chan.recv_ready():
            out.feed(chan.recv(65536))
            got = True
        while chan.recv_stderr_ready():
            err.feed(chan.recv_stderr(65536))
            got = True
        if got:
            quiet_since = time.monotonic()
            continue
        if not wait or chan.eof_received or chan.closed or time.monotonic() - quiet_since > EOF_GRACE_S:
            return
        select.select([chan], [], [], 0.005)


def _lost(connection: paramiko.Transport | None) -> str:
    """A lost connection in words, with paramiko's cause when it kept one (EOF, reset, ...)."""
    cause = connection.get_exception() if connection is not None else None
    return f"connection lost: {cause}" if cause else "connection lost"


def _makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    if not path:
        return
    parts = path.split("/")
    for i in range(1, len(parts) + 1):
        sub = "/".join(parts[:i])
        if not sub:  # the root of an absolute path
            continue
        try:
            sftp.stat(sub)
        except FileNotFoundError:
            sftp.mkdir(sub)


class _Lines:
    """Accumulates a byte stream; calls the sink once per complete line."""

    def __init__(self, worker: int, sink: LineSink | None) -> None:
        self.worker, self.sink = worker, sink
        self.parts: list[bytes] = []
        self.pending = b""

    def feed(self, data: bytes) -> None:
        self.parts.append(data)
        if self.sink is None:
            return
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            self.sink(self.worker, line.decode(errors="replace"))

    def text(self) -> str:
        if self.sink is not None and self.pending:
            self.sink(self.worker, self.pending.decode(errors="replace"))
            self.pending = b""
        return b"".join(self.parts).decode(errors="replace")


class _LoginRefusedError(Exception):
    """The server refused our key: retried only within a just-added key's grace period, never as a network error."""
