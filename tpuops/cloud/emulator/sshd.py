"""Real OpenSSH sshd servers on 127.0.0.1, one per simulated TPU worker (own port, host key, user, home)."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tpuops.cloud.emulator.users import UserLeases
from tpuops.transport.hostkeys import fingerprint_of_public_line

SSHD = shutil.which("sshd", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/sshd"

_CONFIG = """\
ListenAddress 127.0.0.1
{extra_listen}Port {port}
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {authorized_keys}
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
AllowUsers {user}{allow_users}
{keys_command}Subsystem sftp internal-sftp
PrintMotd no
PrintLastLog no
AcceptEnv NONE
{set_env}MaxSessions 200
MaxStartups 200:30:400
LogLevel ERROR
"""


# The host's JAX compilation-cache settings reach every worker session (as a fleet sharing one cache bucket
# would), so emulated workers reuse what the host or another worker compiled instead of each compiling again.
SHARED_ENV = (
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
)


# More of the host's variables for every worker session: their names, comma-separated (the test suite passes the
# PYTHONPATH and JAX setting that let a multi-process run's workers share their compiles, tests/conftest.py).
WORKER_ENV = "TPUOPS_EMULATOR_WORKER_ENV"


def _set_env_line(own: dict[str, str] | None = None) -> str:
    names = [*SHARED_ENV, *(n.strip() for n in os.environ.get(WORKER_ENV, "").split(",") if n.strip())]
    shared = [f"{k}={os.environ[k]}" for k in dict.fromkeys(names) if os.environ.get(k, "").strip()]
    shared += [f"{k}={v}" for k, v in (own or {}).items()]  # this worker's own (its metadata server)
    return f"SetEnv {' '.join(shared)}\n" if shared and all(" " not in v for v in shared) else ""


def sshd_available() -> bool:
    return Path(SSHD).exists() and shutil.which("ssh-keygen") is not None


@dataclass
class SshdWorker:
    """One running sshd standing in for one TPU worker."""

    index: int
    user: str
    home: Path
    port: int
    state_dir: Path
    host_public_key: str  # "ssh-ed25519 AAAA..."
    proc: subprocess.Popen | None = field(default=None, repr=False)
    created_user: bool = False  # this process made the Unix user (remove_users deletes it with its home)
    authorized_keys: Path | None = None  # the worker user's authorized_keys file

    def write_authorized_keys(self, text: str) -> None:
        """Replace the worker user's authorized keys (what the guest agent does on a metadata change)."""
        assert self.authorized_keys is not None
        tmp = self.authorized_keys.with_name(".authorized_keys.tmp")
        tmp.write_text(text.strip() + "\n" if text.strip() else "")
        if os.geteuid() == 0:
            entry = pwd.getpwnam(self.user)
            os.chown(tmp, entry.pw_uid, entry.pw_gid)
        tmp.replace(self.authorized_keys)

    @property
    def fingerprint(self) -> str:
        return fingerprint_of_public_line(self.host_public_key)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """(Re)start sshd on the same port with the same host key."""
        if self.running:
            return
        log = (self.state_dir / "sshd.log").open("ab")
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.state_dir / "sshd_config")],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            process_group=0,  # its own group: stopping it never signals the tests
        )
        _wait_listening(self.port, self.proc)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def regenerate_host_key(self) -> None:
        """Replace the host key and restart (the emulator's "changed host key" fault)."""
        self.stop()
        key = self.state_dir / "ssh_host_ed25519_key"
        for p in (key, Path(f"{key}.pub")):
            p.unlink(missing_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"worker-{self.index}", "-f", str(key)],
            check=True,
        )
        self.host_public_key = " ".join(Path(f"{key}.pub").read_text().split()[:2])
        self.start()

    def drop_connections(self) -> None:
        """Drop every live SSH connection of this worker, as a network cut or an sshd crash would.

        Connection processes run in their own sessions, so this kills the listener's descendants by
        walking /proc. Detached jobs were reparented when their starting shell exited: they survive.
        """
        if self.proc is None:
            return
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        doomed, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            doomed.append(pid)
            todo.extend(children.get(pid, []))
        for pid in reversed(doomed):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.proc = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd on port {port} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.01)
    raise RuntimeError(f"sshd on port {port} did not start listening within {timeout}s")


# Worker users of this process: TPUOPS_SSHD_USER_PREFIX, else a prefix no other live process has (its pid).
_RUN_PREFIX = f"tpuops-{os.getpid()}-{secrets.token_hex(1)}-"
_LEASES = UserLeases("")


def user_prefix() -> str:
    return os.environ.get("TPUOPS_SSHD_USER_PREFIX") or _RUN_PREFIX


def ensure_user(name: str, home: Path) -> bool:
    """Create a Unix user with a plain /bin/sh login (fast logins: no rc files) if it is missing; True if made."""
    created = False
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--home-dir", str(home), "--no-create-home", "--shell", "/bin/sh", name],
            check=True,
            capture_output=True,
        )
        created = True
    # A new account is locked ("!" in shadow) and sshd without PAM refuses locked accounts even for keys;
    # "*" means "no password can match", which leaves key logins open.
    shadow = Path("/etc/shadow").read_text().splitlines()
    if not any(line.startswith(f"{name}:*:") for line in shadow):
        subprocess.run(["usermod", "--password", "*", name], check=True, capture_output=True)
    return created


def remove_users(workers: list[SshdWorker]) -> None:
    """Delete the Unix users (and homes) that this process created, after their sshd stopped.

    Only users this process made and leased are touched, so stopping every process of such a user (the
    detached jobs its tests started) never reaches anything of another run.
    """
    for w in workers:
        w.stop()
        if not w.created_user:
            continue
        delete_user(w.user, w.home)
        w.created_user = False
        _LEASES.give_back(w.user)


def delete_user(name: str, home: Path) -> None:
    """Stop every process of a user this process created, delete it and its home."""
    subprocess.run(["pkill", "-KILL", "-u", name], check=False, capture_output=True)
    for _ in range(50):  # userdel refuses while a process of the user is still exiting
        r = subprocess.run(["userdel", name], check=False, capture_output=True)
        if r.returncode in (0, 6):  # 6: no such user
            break
        time.sleep(0.1)
    shutil.rmtree(home, ignore_errors=True)


def reset_home(name: str, home: Path) -> None:
    """An empty home owned by the user: workers start from a clean filesystem."""
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    entry = pwd.getpwnam(name)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    home.chmod(0o755)


def start_worker(
    index: int,
    state_dir: Path,
    authorized_key: str,
    *,
    user: str | None = None,
    home_root: Path = Path("/home"),
    port: int | None = None,
    extra_listen: tuple[str, ...] = (),
    allow_users: tuple[str, ...] = (),
    keys_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> SshdWorker:
    """Start one sshd. As root each worker gets its own user and home; otherwise all share this user.

    `extra_listen`: more loopback addresses to listen on (the emulator's "external IPs", e.g. 127.0.0.2).
    `allow_users`: more login names (patterns) sshd accepts, e.g. the emulator's OS Login users, whose keys
    sshd reads from `keys_dir/USER` (as the OS Login guest environment asks the OS Login API; root only).
    `env`: variables every session of this worker gets (sshd's SetEnv), e.g. its GCE_METADATA_HOST.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    key = state_dir / "ssh_host_ed25519_key"
    if not key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"worker-{index}", "-f", str(key)],
            check=True,
        )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        if user is None:
            # Unique per process by default; leased so a prefix two runs were both given is caught, not shared.
            user = f"{user_prefix()}w{index}"
            if not _LEASES.hold(user):
                raise RuntimeError(
                    f"sshd worker user {user} is in use by another live run on this machine "
                    "(give this one another TPUOPS_SSHD_USER_PREFIX)"
                )
        home = home_root / user
        created = ensure_user(user, home)
        reset_home(user, home)
        # sshd reads authorized_keys as the user, so it lives in the user's own home.
        auth = home / ".ssh" / "authorized_keys"
        auth.parent.mkdir(mode=0o700)
        auth.write_text(authorized_key.strip() + "\n")
        entry = pwd.getpwnam(user)
        for p in (auth.parent, auth):
            os.chown(p, entry.pw_uid, entry.pw_gid)
    else:
        created = False
        user = pwd.getpwuid(os.geteuid()).pw_name
        home = Path.home()
        auth = state_dir / "authorized_keys"
        auth.write_text(authorized_key.strip() + "\n")
    # A free port can be taken by another process (a concurrent test run) before sshd binds it: try another.
    for attempt in range(5):
        chosen = port or free_port()
        (state_dir / "sshd_config").write_text(
            _CONFIG.format(
                port=chosen,
                dir=state_dir,
                user=user,
                authorized_keys=auth,
                extra_listen="".join(f"ListenAddress {a}\n" for a in extra_listen),
                allow_users="".join(f" {u}" for u in allow_users),
                set_env=_set_env_line(env),
                keys_command=(
                    f"AuthorizedKeysCommand /bin/cat {keys_dir}/%u\nAuthorizedKeysCommandUser root\n"
                    if keys_dir is not None and os.geteuid() == 0
                    else ""
                ),
            )
        )
        worker = SshdWorker(
            index=index,
            user=user,
            home=home,
            port=chosen,
            state_dir=state_dir,
            host_public_key=" ".join(Path(f"{key}.pub").read_text().split()[:2]),
            authorized_keys=auth,
            created_user=created,
        )
        try:
            worker.start()
        except RuntimeError:
            if port or attempt == 4:
                raise
            continue
        return worker
    raise AssertionError("unreachable")


def client_keypair(directory: Path) -> tuple[Path, str]:
    """An ed25519 client identity for tests and the emulator: (private key path, public key line)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "id_ed25519"
    if not key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tpuops", "-f", str(key)], check=True
        )
    return key, Path(f"{key}.pub").read_text().strip()
