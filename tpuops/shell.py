"""Shell command building: quoting, remote paths, environment over stdin, secret redaction."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

REDACTED = "***"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# `alive PID`: running and not a zombie. A finished detached job whose parent is a non-reaping init stays a
# zombie, and `kill -0` alone would call it alive forever.
ALIVE = 'alive() { kill -0 "$1" 2>/dev/null && [ "$(sed \'s/.*) //\' /proc/$1/stat 2>/dev/null | cut -c1)" != Z ]; }'
# `running PID`: that process, or any other of the process group it leads, is running (zombies aside). A
# detached job's children can outlive the shell that leads its group: once jax.distributed is initialised,
# XLA's preemption notifier catches SIGTERM, so a multi-host trainer goes on after its shell died.
RUNNING = (
    ALIVE + '; running() { alive "$1" || cat /proc/[0-9]*/stat 2>/dev/null | '
    'awk -v g="$1" \'{ sub(/.*\\) /, "") } $1 != "Z" && $3 == g { f = 1 } END { exit !f }\'; }'
)


def quote(value: object) -> str:
    """Quote one value for a POSIX shell: whatever it contains, it stays one word and runs nothing."""
    return shlex.quote(str(value))


def path(p: str) -> str:
    """Quote a remote path, keeping a leading `~/` meaning the remote user's home."""
    if p == "~":
        return '"$HOME"'
    if p.startswith("~/"):
        return '"$HOME"/' + shlex.quote(p[2:])
    return shlex.quote(p)


def check_env_names(env: Mapping[str, str]) -> None:
    for name in env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"invalid environment variable name {name!r}: use letters, digits and _")


def env_script(env: Mapping[str, str]) -> bytes:
    """The `export NAME='value'` lines sent on stdin, so values never appear on a command line or in ps."""
    check_env_names(env)
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()).encode()


# Ends the preamble a run puts before each step's own script (sop/claim.guarded: the run lock still this run's);
# the in-memory transport matches its expectations on what follows it, the step's own commands.
STEP_BEGINS = "# tpuops: the step's own commands"


def with_stdin_env(command: str) -> str:
    """Wrap a command so it first reads its environment from stdin (see env_script)."""
    return f'eval "$(cat)"; {command}'


# A worker's sshd runs a command as one argument of the login shell (`bash -c COMMAND`), and Linux takes one
# argument of at most MAX_ARG_STRLEN = 32 pages = 131,072 bytes, its closing NUL included: past it the exec fails
# ("Argument list too long"), and past OpenSSH's 256 KiB packet the connection drops. So a step's command, as
# sent (`with_stdin_env`), is at most this many bytes (tests/tpuops/sop/test_worker_limits.py measures it on sshd).
MAX_COMMAND_BYTES = 131_071


def command_bytes(command: str) -> int:
    """The bytes of `command` as a worker's shell receives it (with_stdin_env's wrapper included)."""
    return len(with_stdin_env(command).encode())


# Values shorter than this are never redacted: a 1-3 character value (`1`, `on`, `dev`) would replace ordinary
# text in every line (and show where the value sits by the holes it leaves), and so short a value is no secret
# against guessing anyway. The same bound applies to each line of a multi-line value and to each encoding.
MIN_SECRET_CHARS = 4


def secret_forms(value: str) -> set[str]:
    """The texts a value may be printed as: itself, each line of a multi-line value (a PEM key), and each of
    those JSON-escaped, shell-quoted and URL-encoded -- every form at least MIN_SECRET_CHARS long."""
    import json
    from urllib.parse import quote, quote_plus

    parts = {value, *(ln.rstrip("\r") for ln in value.split("\n"))}
    forms: set[str] = set()
    for p in parts:
        forms |= {
            p,
            json.dumps(p)[1:-1],  # `"` -> `\"`, `\` -> `\\`, newline -> `\n`, non-ASCII -> `\uXXXX`
            json.dumps(p, ensure_ascii=False)[1:-1],
            shlex.quote(p),
            quote(p, safe=""),
            quote(p),
            quote_plus(p),
        }
    return {f for f in forms if len(f) >= MIN_SECRET_CHARS}


def secret_digest(key: bytes, text: str) -> str:
    """A keyed hash of one secret form: what a run record keeps instead of the value (see Redactor.add_hashed)."""
    import hashlib

    return hashlib.blake2b(text.encode(), key=key, digest_size=16).hexdigest()


class Redactor:
    """Replaces every known secret value, in each of its printed forms (`secret_forms`), with *** in any text that
    leaves tpuops. Values known only by their keyed hashes (a run's sent .env after the local one changed) are
    found by hashing every window of their lengths: correct, but slower, so only those are searched that way."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Follow threads redact while a step adds values: add() builds new objects and rebinds them, so a
        # reader always sees a whole set and its sorted list (never one that changes while it iterates).
        self._secrets: frozenset[str] = frozenset()
        self._sorted: list[str] = []  # the forms, a longer one first
        self._hash_key = b""
        self._hashed: dict[int, set[str]] = {}  # length in characters -> keyed digests of that length
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        new = set().union(*(secret_forms(s) for s in secrets if s)) - self._secrets
        if new:
            merged = self._secrets | new
            self._sorted = sorted(merged, key=len, reverse=True)
            self._secrets = merged
            self._forget_known()

    def add_hashed(self, key: bytes, digests: Iterable[tuple[int, str]]) -> None:
        """Secret forms known by (length, keyed digest) only; those a known value has are dropped."""
        self._hash_key = key
        hashed = {n: set(d) for n, d in self._hashed.items()}
        for length, digest in digests:
            hashed.setdefault(int(length), set()).add(digest)
        self._hashed = hashed
        self._forget_known()

    @property
    def unknown_hashed(self) -> int:
        """Secret forms known only by their hash (each costs a hash per window of its length per line)."""
        return sum(len(d) for d in self._hashed.values())

    def _forget_known(self) -> None:
        if not self._hashed:
            return
        known = {secret_digest(self._hash_key, s) for s in self._secrets}
        self._hashed = {n: d - known for n, d in self._hashed.items() if d - known}

    def __call__(self, text: str) -> str:
        """`text` redacted. Call it on many lines at once where possible: each form is one C-speed search of
        the whole text (about 1 ms per form per MiB), a call per line adds its overhead per line."""
        for form in self._sorted:
            if form in text:
                text = text.replace(form, REDACTED)
        hashed = self._hashed
        return self._redact_hashed(text, hashed) if hashed else text

    def _redact_hashed(self, text: str, hashed: dict[int, set[str]]) -> str:
        """About a microsecond per character per distinct length (minutes for a 100 MiB log): the last resort
        when neither a local nor the worker's .env still holds a value the run was sent."""
        spans: list[tuple[int, int]] = []
        for length in sorted(hashed, reverse=True):
            digests = hashed[length]
            i = 0
            while i + length <= len(text):
                if secret_digest(self._hash_key, text[i : i + length]) in digests:
                    spans.append((i, i + length))
                    i += length
                else:
                    i += 1
        if not spans:
            return text
        spans.sort()
        out, at = [], 0
        for a, b in spans:
            if a < at:  # overlaps the span before (a line of a value inside the value): one *** for both
                at = max(at, b)
                continue
            out += [text[at:a], REDACTED]
            at = b
        out.append(text[at:])
        return "".join(out)
