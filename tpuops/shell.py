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


def with_stdin_env(command: str) -> str:
    """Wrap a command so it first reads its environment from stdin (see env_script)."""
    return f'eval "$(cat)"; {command}'


class Redactor:
    """Replaces every known secret value with *** in any text that leaves tpuops."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        # Very short values would redact ordinary text; a 1-3 character secret is not a secret worth the noise.
        self._secrets.update(s for s in secrets if s and len(s) >= 4)

    def __call__(self, text: str) -> str:
        for s in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(s, REDACTED)
        return text
