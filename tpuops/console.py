"""Where every line tpuops prints goes through: people's output on stderr (rich), JSON on stdout."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypedDict, Unpack

from rich.console import Console

if TYPE_CHECKING:  # built at use (rich.table costs import time on every command)
    from rich.box import Box
    from rich.live import Live as RichLive
    from rich.spinner import Spinner
    from rich.table import Column, Table
    from rich.text import JustifyMethod

out = Console(file=sys.stdout, highlight=False, soft_wrap=True)
err = Console(file=sys.stderr, highlight=False, soft_wrap=True)
_JSON = {"on": False}  # the running command's --json
_VERBOSE = {"on": False}  # -v/--verbose: routine confirmations are shown too


class Routine(str):
    """A note that confirms what was already so (a key already present): shown only with -v/--verbose. A str, so
    every `notify` callable takes it and a test that collects notes still sees it."""

    __slots__ = ()


# Control characters a worker's output may hold: C0 but tab and newline, DEL, C1 (0x9b is a one-byte CSI), and the
# bidirectional overrides that make text read differently from what it is. ESC starts every terminal sequence
# (clear screen, window title, OSC 52 clipboard writes); shown escaped, none of them reaches the terminal.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_RAW = {"on": False}  # `--raw`: the user asked for workers' bytes as they are
_PREFIX: dict[int, str] = {}  # each worker's line prefix, once made


def raw_output(on: bool) -> None:
    """`--raw` (tpuops logs, attach): workers' control sequences reach the terminal unescaped."""
    _RAW["on"] = on


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def inert(text: str) -> str:
    """`text` with every control character shown as an escape (`\\x1b[2J`), unless --raw was given."""
    if _RAW["on"] or (text.isascii() and text.isprintable()) or not _CONTROL.search(text):
        return text  # the first test is C-fast and true for most log lines
    return _CONTROL.sub(_visible, text)


def escape(text: str) -> str:
    """Text shown as is: rich markup in it (a log line's `[w0]`, a path with brackets) is not interpreted, and
    terminal control sequences in it are inert (`inert`)."""
    from rich.markup import escape as rich_escape

    return rich_escape(inert(text))


# One style per step status (sop/status.Status's values: a test checks every member renders; console sits below
# sop/, so it names them as text); anything else shows unstyled.
_STYLE: dict[str, str] = {
    "changed": "green",
    "ok": "green",
    "nothing": "dim",
    "failed": "bold red",
    "busy": "bold yellow",
    "timeout": "bold red",
    "hang": "bold red",
    "cancelled": "yellow",
    "skipped": "dim",
    "detached": "yellow",
}


def status_cell(status: str, detail: str) -> str:
    """A table cell: the status in its style, then the detail, both escaped (never an empty `[]` tag)."""
    text = f"{escape(str(status))} {escape(detail)}".rstrip()
    style = _STYLE.get(status)
    return f"[{style}]{escape(str(status))}[/] {escape(detail)}".rstrip() if style else text


def id_column(header: str, ids: list[str]) -> Column:
    """A column of IDs people copy (run ids, VM names) for `grid`: never cut or wrapped; the others give way."""
    from rich.table import Column

    return Column(header, no_wrap=True, min_width=max([len(header), *map(len, ids)]))


class TableOptions(TypedDict, total=False):
    """The rich Table settings tpuops' tables take (`grid`, `table_of`)."""

    title: str | None
    title_justify: JustifyMethod
    caption: str
    caption_justify: JustifyMethod
    box: Box | None
    pad_edge: bool
    collapse_padding: bool
    show_header: bool


def grid(heads: Sequence[str | Column], rows: Iterable[Sequence[str]], **kw: Unpack[TableOptions]) -> Table:
    """A rich Table of short cells, sized by rich: `heads` the column headers (a `rich.table.Column` where a
    column needs its own settings), `kw` the table's (title, box). Wide tables of long cells: `table_of`."""
    from rich.table import Table

    table = Table(*heads, **kw)
    for row in rows:
        table.add_row(*row)
    return table


@dataclass(frozen=True)
class Col:
    """A column of `table_of`. `kind`: "id" (ids, names, zones, numbers: never cut or wrapped), "wrap" (wrapped
    at spaces, no word cut) or "prose" (one line, cut with an ellipsis). `drop` > 0: left out when the terminal is
    too narrow for every column, the highest first."""

    header: str
    kind: str = "id"
    drop: int = 0
    justify: str = "left"


def _cell_len(cell: str) -> int:
    from rich.text import Text

    return Text.from_markup(cell).cell_len


def _least(col: Col, cells: list[str]) -> int:
    """The narrowest a column may be: its longest cell (id), longest word (wrap), or a few characters (prose)."""
    if col.kind == "id":
        return max([len(col.header), *map(_cell_len, cells)])
    if col.kind == "wrap":
        words = [w for c in cells for w in _plain(c).split()]
        return max([len(w) for w in [*col.header.split(), *words]] or [1])
    return min(max([len(col.header), 8]), max([len(col.header), *map(_cell_len, cells)]))


def _plain(cell: str) -> str:
    from rich.text import Text

    return Text.from_markup(cell).plain


def table_width(cols: list[Col], rows: list[list[str]]) -> int:
    """The narrowest the table of these columns can be with nothing cut (the default box: a border before each
    column and after the last, padding 1+1)."""
    return sum(_least(c, [r[i] for r in rows]) + 3 for i, c in enumerate(cols)) + 1


def table_of(cols: list[Col], rows: list[list[str]], width: int, **kw: Unpack[TableOptions]) -> Table:
    """A rich Table that fits `width` with every id whole: columns with `drop` go first (the caption names
    them: --json has every field), prose is cut with an ellipsis, wrapped columns wrap between words."""
    from rich.table import Table

    keep = list(range(len(cols)))

    def need(ix: list[int]) -> int:
        return table_width([cols[i] for i in ix], [[r[i] for i in ix] for r in rows])

    for i in sorted((i for i in keep if cols[i].drop), key=lambda i: -cols[i].drop):
        if need(keep) <= width:
            break
        keep.remove(i)
    left_out = [cols[i].header for i in range(len(cols)) if i not in keep]
    if left_out:
        kw["caption"] = f"left out at {width} columns: {', '.join(left_out)} (--json has every field)"
        kw.setdefault("caption_justify", "left")
    # Every column's width decided here (rich would squeeze one wrapped column and then overflow the others):
    # ids at their longest cell, then the room left goes to wrapped columns, then to prose, up to their longest.
    widths = {i: _least(cols[i], [r[i] for r in rows]) for i in keep}
    spare = width - need(keep)
    for kind in ("wrap", "prose"):
        for i in (i for i in keep if cols[i].kind == kind):
            natural = max([len(cols[i].header), *(_cell_len(r[i]) for r in rows)])
            more = max(min(natural - widths[i], spare), 0)
            widths[i] += more
            spare -= more
    table = Table(**kw)
    for i in keep:
        c = cols[i]
        table.add_column(
            c.header,
            width=widths[i],
            no_wrap=c.kind != "wrap",
            overflow="fold" if c.kind == "wrap" else "ellipsis",
            justify=c.justify,  # type: ignore[arg-type]
        )
    for r in rows:
        table.add_row(*(r[i] for i in keep))
    return table


def line(worker: int, text: str) -> None:
    """One live log line, prefixed with its worker (cyan on a colour terminal), control characters inert.

    Written straight to the stream, not through rich's renderer (about 50x slower per line): a follow must
    keep up with a worker printing 100,000 lines/s. While a rich live display owns the terminal, through rich.
    """
    if err._live_stack:  # a progress display is drawn below the lines: rich keeps it in place
        err.print(f"[cyan]\\[w{worker}][/cyan] {escape(text)}")
        err.file.flush()
        return
    prefix = _PREFIX.get(worker) or _prefix(worker)
    # sys.stderr writes through (no buffer, a terminal or not): the line is out before the follower saves
    # its offset, so a kill -9 loses no line.
    err.file.write(prefix + inert(text) + "\n")


def _prefix(worker: int) -> str:
    """`[w0] `, cyan where rich would colour (a terminal; NO_COLOR, TERM=dumb and FORCE_COLOR as rich reads them)."""
    colour = err.color_system is not None and not err.no_color
    _PREFIX[worker] = f"\x1b[36m[w{worker}]\x1b[0m " if colour else f"[w{worker}] "
    return _PREFIX[worker]


def log_sink(*, prefix: bool) -> Callable[[int, str], None]:
    """Where `tpuops logs` writes: the log's own lines on stdout (pipeable: `| grep ^step=`), each started
    with `[wK] ` only when `prefix` (several workers, or --prefix)."""

    def write(worker: int, text: str) -> None:
        shown = inert(text)
        sys.stdout.write(f"[w{worker}] {shown}\n" if prefix else f"{shown}\n")
        sys.stdout.flush()

    return write


class Watched(Protocol):
    """What the live view shows (tpuops.logs.progress.Progress): the status line and the lines above it."""

    def status(self, now: float | None = None, width: int | None = None) -> str: ...

    def line(self, worker: int, text: str) -> str: ...

    def phase(self, worker: int, title: str, kind: str, state: str) -> None: ...


def live_wanted(as_json: bool) -> bool:
    """The status line is for people at a terminal: off with --json, in CI (CI=true) and when stderr is not a
    terminal. TPUOPS_LIVE=1 turns it on anyway (compact step rows through a pipe, e.g. for a test), 0 off."""
    forced = os.environ.get("TPUOPS_LIVE", "")
    if as_json or forced == "0":
        return False
    if forced == "1":
        return True
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return False
    return err.is_terminal


class Live:
    """A followed run on stderr: log lines (a step line as a compact row) scroll above one status line with a
    spinner that rich redraws 4 times a second; the status line is gone when the run ends. Without a watched
    run (`watched` None) it is the plain line printer."""

    def __init__(self, watched: Watched | None) -> None:
        self.watched = watched
        self.phase = watched.phase if watched is not None else None
        self._live: RichLive | None = None
        self._spinner: Spinner | None = None

    def line(self, worker: int, text: str) -> None:
        shown = self.watched.line(worker, text) if self.watched is not None else text
        for piece in shown.split("\n"):
            line(worker, piece)

    def _status(self) -> Spinner:
        """The one spinner, its text renewed: a new Spinner at every refresh would start at its first frame
        each time and never turn. The text fits the terminal's width less the spinner's 2 columns."""
        from rich.spinner import Spinner
        from rich.text import Text

        assert self.watched is not None
        text = Text(self.watched.status(width=max(err.width - 2, 20)), style="bold cyan", no_wrap=True)
        if self._spinner is None:
            self._spinner = Spinner("dots", text, style="cyan")
        else:
            self._spinner.update(text=text)
        return self._spinner

    def __enter__(self) -> Live:
        if self.watched is not None and err.is_terminal:
            from rich.live import Live as RichLive

            self._live = RichLive(
                get_renderable=self._status, console=err, transient=True, refresh_per_second=4,
                redirect_stdout=False, redirect_stderr=False,
            )  # fmt: skip
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def event(text: str) -> None:
    """Something tpuops did on its own (a recovery, a reconnect), said once on stderr."""
    err.print(f"[bold magenta]tpuops[/]: {escape(text)}")


def verbose(on: bool) -> None:
    """-v/--verbose: routine confirmations (`Routine` notes) are shown too."""
    _VERBOSE["on"] = on


def is_verbose() -> bool:
    return _VERBOSE["on"]


def note(message: str) -> None:
    """A progress line from the cloud layer (retries, state changes, skipped zones); a `Routine` one only with
    -v/--verbose."""
    if isinstance(message, Routine) and not _VERBOSE["on"]:
        return
    err.print(f"[dim]tpu-api[/dim] {escape(message)}")


def say(message: str) -> None:
    """A progress line from tpuops' own checks; the message names its subject itself (`fit: ...`, `cost: ...`)."""
    err.print(escape(message))


def json_mode(on: bool) -> None:
    """Remember the command's --json (set once, by the CLI's command wrapper) so errors answer in JSON too."""
    _JSON["on"] = on


def emit_json(data: object, default: Callable[[object], object] = str) -> None:
    """The one machine-readable answer of a command, on stdout."""
    from tpuops.jsonout import dumps

    out.print_json(dumps(data, default=default))


def error(message: str, code: int, kind: str) -> None:
    """One error line on stderr; under --json also the error object on stdout (exit code, error_class)."""
    if _JSON["on"]:
        from tpuops.errors import error_class

        emit_json(
            {
                "ok": False,
                "exit_code": code,
                "error_class": error_class(code),
                "error": kind,
                "message": message,
            }
        )
    err.print(f"[bold red]error[/]: {escape(message)}")
