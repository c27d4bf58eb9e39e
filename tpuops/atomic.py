"""Files written whole or not at all: a unique temporary name in the same folder, fsync, then rename.

A reader never sees a half-written run record or cache file, whatever kills the writer (the temporary file is
left behind at worst, under a name no reader looks at); two writers never share a temporary name.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text(path: str | Path, text: str) -> None:
    """Replace `path` with `text` atomically (parents created)."""
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
