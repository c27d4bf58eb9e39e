"""`tpuops doctor`: what each worker has (.env keys by hash, host key, TPU lock) against this machine."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tpuops import shell
from tpuops.errors import ExitCode, TpuopsError
from tpuops.shell import Redactor
from tpuops.sop import secrets
from tpuops.sop.homes import Home, homes
from tpuops.transport.base import Transport


@dataclass
class WorkerHealth:
    worker: int
    address: str
    connected: bool
    error: str | None = None
    env_keys: dict[str, str] = field(default_factory=dict)  # key -> match|differs|missing|extra|unreadable
    env_hashes: dict[str, str] = field(default_factory=dict)  # key -> short sha256 of the worker's value
    lock: str = ""
    homes: list[Home] = field(default_factory=list)  # each repository's home there (sop/homes.py)
    fixes: list[str] = field(default_factory=list)  # one line per problem: what to run (add_fixes)


def local_env(env_file: Path) -> dict[str, str]:
    """The local .env's values (empty when there is none): doctor compares their hashes, never the values."""
    return secrets.parse(env_file.read_bytes())[0] if env_file.exists() else {}


def examine(
    transport: Transport,
    local_values: dict[str, str],
    *,
    remote_env: str,
    lockfile: str,
    redact: Redactor,
) -> list[WorkerHealth]:
    """Connect to every worker of a transport the caller opened (and closes); compare its .env with the
    local one key by key (values never leave hashes)."""
    local = secrets.key_hashes(local_values)

    def one(w: int) -> WorkerHealth:
        h = WorkerHealth(w, transport.workers[w].address, connected=False)
        try:
            transport.connect(w)
            h.connected = True
            data = transport.read_from(w, remote_env, 0)
            remote = secrets.key_hashes(secrets.parse(data)[0]) if data is not None else {}
            unreadable = set(secrets.unreadable_keys(data)) if data is not None else set()
            h.env_hashes = remote
            for key in sorted(set(local) | set(remote) | unreadable):
                if key in unreadable and key not in remote:
                    h.env_keys[key] = "unreadable"  # present on a line python-dotenv cannot parse
                elif key not in remote:
                    h.env_keys[key] = "missing"
                elif key not in local:
                    h.env_keys[key] = "extra"
                else:
                    h.env_keys[key] = "match" if local[key] == remote[key] else "differs"
            r = transport.run(w, f"if [ -e {shell.path(lockfile)} ]; then echo present; else echo absent; fi")
            h.lock = r.stdout.strip()
            h.homes = homes(transport, w)
        except TpuopsError as e:
            h.error = redact(e.line())
        return h

    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(one, range(len(transport.workers))))


def exit_code(health: list[WorkerHealth]) -> int:
    """1 when a worker is unreachable or its .env lacks or differs from a local key (or cannot be read), else 0."""
    bad = any(
        not h.connected or any(s in ("differs", "missing", "unreadable") for s in h.env_keys.values())
        for h in health
    )
    return int(ExitCode.FAILED if bad else ExitCode.OK)


def add_fixes(health: list[WorkerHealth], target: str) -> None:
    """Each problem's fix, as the command to run (`target`: the words that name the target, `--vm NAME`):
    a worker not reached, .env keys missing or different (the sync SOP sends the local .env), a line the
    worker's .env cannot be read at, a TPU lock left behind."""
    for h in health:
        h.fixes = []
        if not h.connected:
            h.fixes.append(
                f"w{h.worker} not reached: fix what the error says, then `tpuops doctor {target}` again"
            )
            continue
        stale = sorted(k for k, s in h.env_keys.items() if s in ("missing", "differs"))
        if stale:
            keys = ", ".join(stale)
            h.fixes.append(
                f"w{h.worker} .env lacks or differs in {keys}: `tpuops sop run sync {target}` sends yours"
            )
        unreadable = sorted(k for k, s in h.env_keys.items() if s == "unreadable")
        if unreadable:
            h.fixes.append(f"w{h.worker} .env has an unreadable line for {', '.join(unreadable)}: rewrite it as "
                           f"KEY=VALUE there, or send yours with `tpuops sop run sync {target}`")  # fmt: skip
        if h.lock == "present":
            h.fixes.append(f"w{h.worker} TPU lock file present: `tpuops sop run lockfile {target}` shows who holds "
                           "it and clears it (--force stops the holders)")  # fmt: skip
