"""A log as it is shown: read a chunk at a time, cut into whole lines, a line longer than LINE_LIMIT in pieces.

The follow, the fetch and `tpuops logs` (a worker's log, or its local copy) all read this way, so the client's
memory stays a few chunks whatever the log holds: a 120 MB line (a dumped array, a progress bar that never prints
a newline) is never held whole; it is shown as pieces of at most LINE_LIMIT characters, one per output line."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

READ_CHUNK = 4 << 20  # bytes per read of a log (a worker's or a local copy)
# A line longer than this is shown in pieces of this many characters, each on its own line (the scanner reads only
# a line's first MiB too: logs/scanner.py MAX_LINE). A partial line waits for the rest of its line up to this long.
LINE_LIMIT = 1 << 20


def whole_lines(data: bytes) -> tuple[bytes, bytes]:
    """(the whole lines of `data`, the partial line after them). A partial line longer than LINE_LIMIT counts as
    whole (cut), so a log with no newline cannot fill the memory."""
    cut = data.rfind(b"\n") + 1
    if len(data) - cut > LINE_LIMIT:
        return data, b""
    return data[:cut], data[cut:]


def pieces(text: str) -> Iterator[str]:
    """The lines of `text` (whole lines, a final newline ending the last one), each longer than LINE_LIMIT
    characters as pieces of LINE_LIMIT."""
    if not text:
        return
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    for line in lines:
        if len(line) <= LINE_LIMIT:
            yield line
        else:
            yield from (line[i : i + LINE_LIMIT] for i in range(0, len(line), LINE_LIMIT))


def shown(chunks: Iterable[bytes], redact: Callable[[str], str]) -> Iterator[str]:
    """Every line of a log read as `chunks`, redacted a block of whole lines at a time, in pieces past
    LINE_LIMIT."""
    pending = b""
    for chunk in chunks:
        block, pending = whole_lines(pending + chunk)
        yield from pieces(redact(block.decode(errors="replace")))
    if pending:
        yield from pieces(redact(pending.decode(errors="replace")))


def file_lines(path: Path) -> Iterator[str]:
    """A local log's lines as `shown` gives them (a fetched copy was redacted when it was written)."""
    with path.open("rb") as f:
        yield from shown(iter(lambda: f.read(READ_CHUNK), b""), lambda text: text)
