"""The state home (`$TPUOPS_HOME`, else ~/.tpuops): run folders 0700, their files 0600, written atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO


def state_home() -> Path:
    """Where tpuops keeps known_hosts, local run copies and the local transport's scratch root."""
    return Path(os.environ.get("TPUOPS_HOME") or Path.home() / ".tpuops")


def private_dir(path: Path) -> Path:
    """A folder only its owner can read (0700), made with its parents; an existing one is narrowed to 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def run_folder(run_id: str) -> Path:
    """`<state home>/runs/<run_id>`, both folders 0700: run records and log copies may quote a worker's output."""
    private_dir(state_home() / "runs")
    return private_dir(state_home() / "runs" / run_id)


def open_private(path: Path) -> BinaryIO:
    """A file opened for writing that is 0600 from its first byte (no window in which another user could open it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    return os.fdopen(fd, "wb")


def write_private(path: Path, data: bytes) -> None:
    with open_private(path) as f:
        f.write(data)


def write_atomic(path: str | Path, text: str) -> None:
    """Replace `path` with `text` whole or not at all: a unique temporary name in the same folder, fsync, then
    rename. A reader never sees half a run record or cache file, whatever kills the writer (a temporary file is
    left behind at worst, under a name no reader looks at); two writers never share a temporary name."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        Path(tmp).replace(target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
