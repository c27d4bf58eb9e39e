"""The local .env: parsed with python-dotenv, normalised (CRLF, stray spaces), hashed; values never shown."""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EnvFile:
    values: dict[str, str]
    fixed: tuple[str, ...]  # key names whose raw value had CRLF or surrounding whitespace removed

    def digest(self) -> str:
        return hashlib.sha256(serialize(self.values)).hexdigest()

    def key_hashes(self) -> dict[str, str]:
        """Per-key short hashes, to compare workers' files without showing a value."""
        return {k: hashlib.sha256(v.encode()).hexdigest()[:12] for k, v in self.values.items()}


def load(path: Path) -> EnvFile:
    from dotenv import dotenv_values

    text = path.read_bytes().decode()
    raw = dotenv_values(stream=_StringIO(text.replace("\r\n", "\n").replace("\r", "\n")))
    crlf = "\r" in text
    values: dict[str, str] = {}
    fixed: list[str] = []
    for key, value in raw.items():
        v = value or ""
        clean = v.strip()
        if clean != v or crlf:
            fixed.append(key)
        values[key] = clean
    return EnvFile(values, tuple(fixed) if crlf or fixed else ())


def serialize(values: dict[str, str]) -> bytes:
    """A canonical file any POSIX shell can source (`set -a; . ./.env`) and python-dotenv can read."""
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(values.items())).encode()


def normalized_env_bytes(path: Path) -> bytes:
    return serialize(load(path).values)


def _StringIO(text: str):  # noqa: N802 - tiny local import keeps `io` off the hot path
    import io

    return io.StringIO(text)
