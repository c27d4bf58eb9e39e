"""The one follower: reads each worker's log from a byte offset, shows it, feeds the log scanner, acts on its events.

Each worker's log is parsed once: one LogScanner per worker (`Readings`) is fed every line as the follow reads it,
and the fetch feeds it only what the follow did not read; the run's LogReport is made from those scanners."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from tpuops.config import open_private, private_dir, write_private
from tpuops.errors import HostKeyError, TpuopsError
from tpuops.logs.actions import Fetch, Follow
from tpuops.logs.chunks import READ_CHUNK, pieces, shown, whole_lines
from tpuops.logs.events import Event, Failure, LogReport, StepEvent, exit_status, merge
from tpuops.logs.hang import HangWatch
from tpuops.logs.probes import job_died, py_spy
from tpuops.logs.scanner import LogScanner
from tpuops.shell import Redactor
from tpuops.transport.base import CmdResult, Kind, LineSink, Transport
from tpuops.transport.retry import Backoff


@dataclass
class Reading:
    """One worker's log as this process reads it: its scanner, fed each line once and in order."""

    scanner: LogScanner
    events: list[Event]  # what the scanner handed out and the follow has not passed on yet
    fed: int = 0  # bytes of the log fed to the scanner (a line boundary, or a cut overlong line)
    complete: bool = False  # read to its end: the follow saw the exit file, or a fetch read the whole log


@dataclass
class Readings:
    """The logs of one run, one Reading per worker, made on first use with the run's scan settings (the
    SOP's `scan:` warm-up, its step-line pattern): the follow and the fetch feed them, `report()` reads them."""

    warmup: int = 1
    step_pattern: str | None = None
    workers: dict[int, Reading] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def of(self, w: int) -> Reading:
        with self._lock:  # each worker's follow runs in its own thread
            if w not in self.workers:
                events: list[Event] = []
                scanner = LogScanner(self.warmup, w, on_event=events.append, step_pattern=self.step_pattern)
                self.workers[w] = Reading(scanner, events)
            return self.workers[w]

    @property
    def complete(self) -> list[int]:
        """The workers whose whole log was read (and so is in `report()`)."""
        return sorted(w for w, r in self.workers.items() if r.complete)

    def report(self) -> LogReport | None:
        """The run's log report from the scanners of the workers read to their end (merged as `tpuops report`
        merges a run's fetched logs); None when no worker's log was. A worker read only in part (its follow
        ended early and its fetch failed) is left out, as its log file would be: it was never fetched."""
        parts = [self.workers[w].scanner.close() for w in self.complete]
        return merge(parts) if parts else None


@dataclass
class _Poll:
    """One worker's follow in progress: where its log was read to, the partial line after it, what an earlier
    follow showed (`shown`, a byte offset), whether its lines are shown, its hang watch (process 0)."""

    w: int
    action: Follow
    reading: Reading
    shown: int
    offset: int
    show: bool
    hang: HangWatch | None
    pending: bytes = b""
    polls: int = 0
    t0: float = field(default_factory=time.monotonic)


@dataclass
class Follower:
    """Follows a run's logs over one transport. Consumers hear the scanner's typed events (`on_event`, every
    worker), process 0's hang detection acts on its step events, `offsets` says how far each log was shown,
    `reads` holds each worker's scanner (the run's one parse of its log)."""

    transport: Transport
    redact: Redactor = field(default_factory=Redactor)
    on_line: LineSink | None = None  # the lines shown, already redacted
    on_past: LineSink | None = None  # attach: the lines an earlier follow showed (not shown again), redacted
    on_event: Callable[[Event], None] | None = None
    # Bytes of each worker's log already shown: following starts there and keeps it current (for attach).
    offsets: dict[int, int] = field(default_factory=dict)
    on_offset: Callable[[dict[int, int]], None] | None = None
    abort: threading.Event = field(default_factory=threading.Event)  # set from outside: stop following now
    # Set from outside (Ctrl-C): stop following at once; the job goes on (`tpuops attach` resumes).
    detach: threading.Event = field(default_factory=threading.Event)
    # Each worker's scanner. It also keeps when this follower saw each step line that prints no duration (its
    # `seen`): the fetch writes that beside the log (`worker-<k>.seen.json`), and the report's step time for
    # those lines is the gap between them (None for lines one poll brought together).
    reads: Readings = field(default_factory=Readings)

    def follow(self, w: int, action: Follow, cancel: threading.Event) -> CmdResult:
        """Poll the log from the last byte seen; reconnects keep the offset, so no line is lost or repeated.

        Ends (its result's `kind`) at the worker's exit file (OK, the job's code in `job_exit`), a hang
        (HUNG, the py-spy dump in stdout), a timeout (TIMEOUT), a lost connection (CONNECT), a dead job
        (DIED), `detach` (DETACHED: Ctrl-C, the job goes on), `cancel` (CANCELLED) or `abort` (ABORTED).
        The exit file's notes (`stopped`, `nospace`) come in `job_notes`.

        The worker's scanner (`reads`) is fed from where it stopped: a follow in a new process (`attach`)
        first feeds it, unshown and without events, the lines an earlier follow already showed.
        """
        log, exit_file = f"{action.run_dir}/worker-{w}.log", f"{action.run_dir}/worker-{w}.exit"
        reading = self.reads.of(w)
        hang = HangWatch(action) if action.hang_factor and w == 0 else None
        p = _Poll(
            w, action, reading, self.offsets.get(w, 0), reading.fed, action.stream == "all" or w == 0, hang
        )
        backoff = Backoff(action.poll_s, 2.0, 10.0)  # between reads that failed (a reconnect each)
        delays = backoff.delays()
        while True:
            p.polls += 1
            try:
                code = self.transport.read_from(w, exit_file, 0)  # read before the log: no line left behind
                chunk = self.transport.read_from(w, log, p.offset, READ_CHUNK) or b""
                delays = backoff.delays()
            except HostKeyError:
                raise  # a changed host key is never retried: the worker may be another machine now (exit 3)
            except (OSError, EOFError, TpuopsError) as e:
                if (ended := self._unreachable(p, e)) is not None:
                    return ended
                self.detach.wait(next(delays))
                continue
            more = len(chunk) == READ_CHUNK  # the log goes on past this read: read again at once
            code = None if more else code  # the exit file counts once the whole log is read
            status, notes = exit_status(code)
            last = self._feed(p, chunk, status)
            if (ended := self._events(p)) is not None:
                return ended
            if status is not None:
                if p.show and last:
                    self._show(w, last)
                self.offsets[w] = max(p.offset, p.shown)
                return CmdResult(w, action.render(), 0, job_exit=status, offset=p.offset, job_notes=notes)
            if (ended := self._stopped(p, cancel, code)) is not None:
                return ended
            if not more:
                self.detach.wait(action.poll_s)

    def _unreachable(self, p: _Poll, e: Exception) -> CmdResult | None:
        """A read that failed: the follow's end when it was detached, aborted or past its timeout; None: retry."""
        if self.detach.is_set():
            return self._ended(p.w, p.action, Kind.DETACHED, "detached: the job goes on")
        if self.abort.is_set():
            return self._ended(p.w, p.action, Kind.ABORTED, "aborted: the VM is gone")
        if time.monotonic() - p.t0 > p.action.timeout:
            return self._ended(p.w, p.action, Kind.CONNECT, f"lost connection: {e}")
        return None

    def _feed(self, p: _Poll, chunk: bytes, status: int | None) -> str:
        """A read's whole lines (a partial one waits for the next chunk), shown and fed to the scanner redacted,
        as the fetched copy has them; lines an earlier follow showed are only fed. At the job's end (`status`)
        its last line is whole: fed, and returned when it was never shown ("" otherwise)."""
        scanner, polled = p.reading.scanner, p.reading.events
        start = p.offset - len(p.pending)  # where `block` starts in the log
        block, p.pending = whole_lines(p.pending + chunk)
        p.offset += len(chunk)
        old, new = _split(block, p.shown - start)
        if old:
            self._past(p, old)
        if new:
            text = self.redact(new.decode(errors="replace"))
            if p.show:
                self._show(p.w, text)
            scanner.feed_bytes(text.encode(), at=time.time())
            # Saved after the lines were shown (never lose one), and only whole lines count:
            # a reattach resumes at the start of a partial line.
            self.offsets[p.w] = p.offset - len(p.pending)
            if self.on_offset:
                self.on_offset(self.offsets)
        p.reading.fed = p.offset - len(p.pending)
        fresh = p.reading.fed >= p.shown  # the partial line after the whole ones was never shown
        last = self.redact(p.pending.decode(errors="replace")) if status is not None and p.pending else ""
        if last:  # the job ended: its last line is whole
            scanner.feed_bytes(last.encode() + b"\n", at=time.time() if fresh else None)
            if not fresh:
                polled.clear()
        if status is not None:
            if not p.reading.complete:
                scanner.exit(status)
            p.reading.fed, p.reading.complete = p.offset, True
        return last if fresh else ""

    def _past(self, p: _Poll, old: bytes) -> None:
        """Lines an earlier follow showed (attach): fed, passed to `on_past`, their steps timed from now."""
        past = self.redact(old.decode(errors="replace"))
        p.reading.scanner.feed_bytes(past.encode())
        if p.show and self.on_past is not None:
            for ln in past.splitlines():
                for piece in pieces(ln):
                    self.on_past(p.w, piece)
        if p.hang is not None:  # attach: the steps shown before count, timed from now
            p.hang.check([e for e in p.reading.events if isinstance(e, StepEvent)])
        p.reading.events.clear()  # their events went out when they were shown

    def _events(self, p: _Poll) -> CmdResult | None:
        """The read's events handed out, and process 0's hang check: the follow's end when it hung and
        `on_hang` is stop (a note and the py-spy dump otherwise)."""
        polled = p.reading.events
        events, polled[:] = list(polled), []
        self._hand_out(events)
        hung = p.hang.check([e for e in events if isinstance(e, StepEvent)]) if p.hang is not None else None
        if not hung:
            return None
        dump = self.redact(py_spy(self.transport, p.w, p.action)) if p.action.py_spy else ""
        if p.action.on_hang == "stop":
            return self._ended(p.w, p.action, Kind.HUNG, f"hung: {hung}", stdout=dump)
        if self.on_line:
            self.on_line(p.w, f"tpuops: worker looks hung: {hung} (still following)")
            for text in dump.splitlines():
                self.on_line(p.w, f"tpuops: py-spy: {text}")
        return None

    def _stopped(self, p: _Poll, cancel: threading.Event, code: bytes | None) -> CmdResult | None:
        """The follow's end before the exit file: detached, cancelled, the job dead, aborted or timed out."""
        w, action = p.w, p.action
        if self.detach.is_set():
            return self._ended(w, action, Kind.DETACHED, "detached: the job goes on")
        if cancel.is_set():
            return self._ended(w, action, Kind.CANCELLED, "cancelled: another worker failed")
        if p.polls % 10 == 0 and code is None and job_died(self.transport, w, action):
            return self._ended(w, action, Kind.DIED, "the job died without an exit code (killed?)")
        if self.abort.is_set():
            return self._ended(w, action, Kind.ABORTED, "aborted: the VM is gone")
        if time.monotonic() - p.t0 > action.timeout:
            return self._ended(w, action, Kind.TIMEOUT, f"timed out after {action.timeout:g}s")
        return None

    def _show(self, w: int, text: str) -> None:
        """Whole lines, already redacted as one text (one search per secret form, not one per line), shown (a
        line longer than LINE_LIMIT in pieces)."""
        if self.on_line is None:
            return
        for line in pieces(text):
            self.on_line(w, line)

    def show_log(self, w: int, path: str) -> None:
        """A whole worker log shown once, read and redacted READ_CHUNK at a time (`tpuops logs`)."""

        def chunks() -> Iterator[bytes]:
            offset = 0
            while chunk := self.transport.read_from(w, path, offset, READ_CHUNK):
                offset += len(chunk)
                yield chunk

        if self.on_line is not None:
            for line in shown(chunks(), self.redact):
                self.on_line(w, line)

    def follow_all(self, workers: list[int], action: Follow) -> dict[int, CmdResult]:
        """Follow several workers at once (one thread each) until each one's follow ends."""
        results: dict[int, CmdResult] = {}
        refused: list[HostKeyError] = []
        cancel = threading.Event()  # never set: one worker's end does not stop the others

        def one(w: int) -> None:
            try:
                results[w] = self.follow(w, action, cancel)
            except HostKeyError as e:  # the others stop too, and the error is the attach's (exit 3)
                refused.append(e)
                self.abort.set()

        threads = [threading.Thread(target=one, args=(w,), daemon=True) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if refused:
            raise refused[0]
        return results

    def fetch(self, w: int, action: Fetch, local_runs: Path | None) -> CmdResult:
        """Copy a worker's log (redacted) and its exit file into `<local_runs>/<run id>/`; None: only check.

        Streamed: READ_CHUNK bytes at a time into a temporary 0600 file renamed into place when complete. The
        worker's scanner is fed the lines its follow did not read (none after a follow to the exit file; the
        rest of the log after a follow that ended early), so the whole log is read once, and the log is then
        complete in `reads`."""
        log = f"{action.run_dir}/worker-{w}.log"
        data = self.transport.read_from(w, log, 0, READ_CHUNK)
        if data is None:
            return CmdResult(w, action.render(), 1, stderr="no log on the worker", kind=Kind.MISSING)
        dest, size = None, len(data)
        if local_runs is not None:
            dest = local_runs / action.run_dir.rstrip("/").rsplit("/", 1)[-1] / f"worker-{w}.log"
            private_dir(dest.parent)
            tmp = dest.with_name(f".{dest.name}.tmp")
            reading = self.reads.of(w)
            with open_private(tmp) as out:
                pending, start = b"", 0  # `start`: where the next block starts in the log
                while data:
                    block, pending = whole_lines(pending + data)
                    text = self.redact(block.decode(errors="replace"))
                    out.write(text.encode())
                    _feed_unread(reading, block, start, text, self.redact)
                    start += len(block)
                    data = self.transport.read_from(w, log, size, READ_CHUNK) or b""
                    size += len(data)
                last = self.redact(pending.decode(errors="replace"))
                out.write(last.encode())
                _feed_unread(reading, pending, start, last, self.redact)  # the scanner's close() ends it
            tmp.replace(dest)
            code = self.transport.read_from(w, f"{action.run_dir}/worker-{w}.exit", 0)
            if code is not None:  # the report tells a finished job from a killed one by this file
                write_private(dest.with_suffix(".exit"), code)
            if not reading.scanner.exited:  # read after the log, as the follow reads it
                reading.scanner.exit(exit_status(code)[0])
            reading.events.clear()  # a fetch hands out no event: the run's live consumers are done
            reading.complete = True
            if reading.scanner.seen:
                write_private(dest.with_suffix(".seen.json"), json.dumps(reading.scanner.seen).encode())
            config = self.transport.read_from(w, f"{action.run_dir}/config.json", 0) if w == 0 else None
            if config is not None:  # the trainer's full config (its log has a one-line summary)
                write_private(
                    dest.with_name("config.json"), self.redact(config.decode(errors="replace")).encode()
                )
        return CmdResult(w, action.render(), 0, stdout=f"tpuops: fetched bytes={size} to={dest}\n")

    def _ended(self, w: int, action: Follow, kind: Kind, why: str, stdout: str = "") -> CmdResult:
        """A follow that ended before the job's exit file: how (typed), and why in words for people."""
        codes = {
            Kind.HUNG: 124,
            Kind.TIMEOUT: 124,
            Kind.CANCELLED: 130,
            Kind.ABORTED: 130,
            Kind.CONNECT: 255,
            Kind.DETACHED: 130,
        }
        return CmdResult(
            w, action.render(), codes.get(kind, 1), stdout=stdout, error=why, kind=kind,
            offset=self.offsets.get(w),
        )  # fmt: skip

    def _hand_out(self, events: list[Event]) -> None:
        if not self.on_event:
            return
        for e in events:
            if isinstance(e, Failure):  # the raw line may hold a secret: consumers get it redacted
                self.on_event(replace(e, message=self.redact(e.message), detail=self.redact(e.detail)))
            else:
                self.on_event(e)


def _feed_unread(reading: Reading, raw: bytes, start: int, text: str, redact: Redactor) -> None:
    """A fetched block (`raw`, from byte `start` of the log; `text`: it redacted) to the worker's scanner, but
    only what its follow did not feed it: each line is parsed once."""
    end = start + len(raw)
    if end <= reading.fed:
        return
    if start < reading.fed:  # the follow stopped inside this block (at a line start): only the rest is new
        text = redact(raw[reading.fed - start :].decode(errors="replace"))
    reading.scanner.feed_bytes(text.encode())
    reading.fed = end


def _split(block: bytes, at: int) -> tuple[bytes, bytes]:
    """`block` cut at byte `at` (clamped to it): (before, after)."""
    at = min(max(at, 0), len(block))
    return block[:at], block[at:]
