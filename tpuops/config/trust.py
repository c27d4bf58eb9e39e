"""Settings and SOPs only from places the user owns: the walk up from the working folder, stopped at the
repository's root and at any folder another user owns or every user can write (as git's safe.directory)."""

from __future__ import annotations

import os
from pathlib import Path

from tpuops.errors import UsageError


def untrusted(path: Path) -> str | None:
    """Why settings or SOPs at `path` must not be taken unasked, or None when they may: as git's
    safe.directory, only what this user (or root) owns and no other user can write."""
    try:
        st = path.stat()
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if st.st_uid not in (os.geteuid(), 0):
        import pwd

        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = f"uid {st.st_uid}"
        return f"owned by {owner}"
    if st.st_mode & 0o002:
        return "writable by every user"
    return None


def search_up(cwd: Path) -> list[Path]:
    """Where tpuops.toml and sops/ are looked for, nearest first: `cwd` and the folders above it up to the
    repository's root (the nearest folder with a .git), never into a folder another user owns or can write (a
    shared /tmp, another user's project): what they hold was not put there by this user."""
    found: list[Path] = []
    for d in [cwd, *cwd.parents]:
        if untrusted(d) is not None:
            break
        found.append(d)
        if (d / ".git").exists():
            break
    return found


def refuse_untrusted(path: Path, what: str) -> None:
    """Exit 2 when `path`, found on the way up, is another user's or writable by every user."""
    why = untrusted(path)
    if why is not None:
        trust = "tpuops --config PATH" if what == "settings" else "sops_dir in your own tpuops.toml"
        raise UsageError(
            f"{path}: {why}: tpuops takes {what} only from files this user owns",
            hint=f"to use it anyway, name it yourself ({trust}), or make it yours (chown, chmod o-w)",
        )
