"""Each repository's home on the workers, for people and for --json: `tpuops doctor`'s homes section and what
`tpuops vm clean` removed and kept."""

from __future__ import annotations

import time
from dataclasses import asdict

from tpuops.console import Col, emit_json, err, escape, table_of
from tpuops.sop.homes import Home


def as_dict(home: Home) -> dict[str, object]:
    return {**asdict(home), "path": home.path}


def size(kb: int) -> str:
    return f"{kb} KB" if kb < 1024 else f"{kb / 1024:.1f} MB" if kb < 1 << 20 else f"{kb / (1 << 20):.1f} GB"


def age(used: int, now: float) -> str:
    """`2026-11-29 06:46 (3 h ago)`: the last use in local time and how long ago."""
    ago = max(0.0, now - used)
    words = (
        f"{int(ago // 86400)} d"
        if ago >= 86400
        else f"{int(ago // 3600)} h"
        if ago >= 3600
        else f"{int(ago // 60)} min"
    )
    return f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(used))} ({words} ago)"


def table(homes: list[Home], title: str, *, state: bool) -> None:
    now = time.time()
    cols = [Col("worker"), Col("home", "wrap"), Col("size"), Col("last use", "wrap")]
    cols += [Col("done", "wrap")] if state else []
    cols.append(Col("in use", "wrap"))
    rows = [
        [
            f"w{h.worker}",
            escape(h.path),
            size(h.kb),
            age(h.used, now),
            *([h.state] if state else []),
            escape(h.why),
        ]
        for h in homes
    ]
    err.print(table_of(cols, rows, err.width, title=title))


def doctor_homes(homes: list[Home], vm: str | None) -> None:
    """Under doctor's table: each home on each worker (none: one line says so)."""
    if not homes:
        err.print("homes: none on the workers (~/tpuops/<repository>-<hash>/)")
        return
    table(homes, "homes: each repository's checkout and venv", state=False)
    if vm:
        err.print(f"`tpuops vm clean {vm} [--older-than 7d]` removes those not in use")


def cleaned(homes: list[Home], as_json: bool) -> None:
    if as_json:
        emit_json({"homes": [as_dict(h) for h in homes]})
        return
    if not homes:
        err.print("nothing to clean: no homes on the workers")
        return
    table(homes, "homes", state=True)
    gone = [h for h in homes if h.state == "removed"]
    kept = len(homes) - len(gone)
    err.print(f"removed {len(gone)} ({size(sum(h.kb for h in gone))}), kept {kept}")
