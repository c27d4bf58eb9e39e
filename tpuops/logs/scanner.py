"""The streaming log reader: lines in (their shapes in logs/lines.py), typed events and a LogReport out, never
printing."""

from __future__ import annotations

import copy
import re
from collections import Counter
from collections.abc import Callable

from tpuops.logs.blocks import Blocks
from tpuops.logs.events import (
    MAX_EVENTS,
    Compile,
    Event,
    ExitEvent,
    Failure,
    LogReport,
    Stats,
    StepEvent,
    apply_exit,
    chip_sample,
    mean,
)
from tpuops.logs.fields import MAX_FIELDS, kv, parse
from tpuops.logs.lines import (
    CACHE_HIT,
    CACHE_MISS,
    COMPILE,
    CONFIG_SUMMARY,
    DT_ANY,
    EXPLAIN_LINES,
    FAILURE_HINT,
    FAILURES,
    JSON_LINE,
    MAX_DT_KEYS,
    MAX_LINE,
    MAX_ROWS,
    MAX_SEEN,
    RECORD,
    STEP,
    STEP_ANY,
    TRACEBACK,
    WANDB_STATE,
    WANDB_URL,
    _dt_value,
    _duration,
    _seconds,
    _stamp,
    compile_step_pattern,
)


class LogScanner(Blocks):
    """Feed lines (live) or bytes (files); `report()` at any time. Memory is bounded whatever the log size.

    `on_event` hears each step line, training compile and failure as it is read, and the exit (`exit()`):
    what a live consumer (hang detection, recovery, attach) acts on without waiting for the report.

    Step lines: the bundled trainer's `step=N ... dt=Ts`, and the common forms people print (STEP_ANY), or only
    `step_pattern` when given. A step line without a duration gets the gap since the previous step line: from
    the timestamps of their logging prefixes, else from `seen` (step -> when a follower saw its line: a live
    reader's `feed_bytes(..., at=)` writes it, a later read of the fetched file gets it from
    `worker-<k>.seen.json`), else from `clock` (a live reader's own clock).
    """

    def __init__(
        self,
        warmup: int = 1,
        worker: int = 0,
        source: str = "",
        on_event: Callable[[Event], None] | None = None,
        step_pattern: str | re.Pattern[str] | None = None,
        clock: Callable[[], float] | None = None,
        seen: dict[int, float] | None = None,
    ) -> None:
        self.warmup = warmup
        self.on_event = on_event
        if isinstance(step_pattern, str):
            step_pattern = compile_step_pattern(step_pattern)
        self.step_pattern = step_pattern
        # What the step-line regex in use has (Pattern.groupindex is a new dict on every access).
        groups = (step_pattern or STEP_ANY).groupindex
        self._dt_group, self._stamped = "dt" in groups, "date" in groups and "amd" in groups
        self.clock = clock
        # step -> when a follower saw its line, for lines with no duration (kept, not copied: the follower
        # writes this very dict beside the fetched log)
        self.seen = seen if seen is not None else {}
        self._at: float | None = None  # when the lines being fed arrived (a live reader), else None
        self._exit: tuple[int | None] | None = None  # the worker's exit code once told (`exit()`)
        self._last_seen: float | None = None  # the clock when the previous step line was seen
        self._last_match: re.Match[str] | None = None  # the previous step line (its timestamp, if needed)
        self.r = LogReport(source=source, workers=[worker], warmup=warmup)
        self.r.compiles = {"total": 0, "warmup": 0, "eval": 0, "after_warmup": 0, "open": 0}
        self.worker = worker
        # steady-state dt tokens (b"dt=1.23s", or the seconds of other step lines) -> count
        self._dt: Counter[bytes | float] = Counter()
        self._dt_coarse: Counter[float] = Counter()
        self._rows: list[bytes | tuple[int, float | None, str]] = []  # lines, parsed when a report is made
        self._last_row: bytes | tuple[int, float | None, str] | None = None
        self._pending: list[Compile] = []  # compiles in the open window, assigned when the next step= arrives
        self._explain: dict[str, str] = {}  # function name -> latest cache-miss explanation not yet used
        self._miss: list[str] | None = None
        self._tb: dict[str, str] | None = None
        self._in_eval = False
        self._partial = b""

    # ---- input ----
    def feed(self, line: str) -> None:
        """One line (with or without its newline; several lines also work), e.g. from a live follow."""
        self._lines(line.removesuffix("\n").encode().split(b"\n"))

    def feed_bytes(self, data: bytes, at: float | None = None) -> None:
        """A chunk of a file; a trailing partial line waits for the next chunk or `close()`. `at`: when a live
        reader saw these lines (unix time): step lines without a duration are timed by it (`seen`)."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE:
            self._partial = self._partial[:MAX_LINE]
        self._at = at
        try:
            self._lines(lines)
        finally:
            self._at = None

    def exit(self, code: int | None) -> None:
        """The worker's exit code (None: no exit file, the job was killed or is still running). It joins the
        report after the last line (`close()` first, as a read of the log file and its exit file does)."""
        self._exit = (code,)
        if code is not None and self.on_event:
            self.on_event(ExitEvent(self.worker, code))

    @property
    def exited(self) -> bool:
        """The exit code (or its absence) was told."""
        return self._exit is not None

    def close(self) -> LogReport:
        """End of input: the last partial line counts, and a traceback cut off by the end is reported."""
        if self._partial:
            self._lines([self._partial])
            self._partial = b""
        self._end_blocks()
        return self.report()

    def _lines(self, lines: list[bytes]) -> None:
        # Fast path: runs of step= lines are counted in bulk; only the other lines go through the regex table.
        if self.step_pattern is not None:
            others = list(range(len(lines)))
        else:
            others = [i for i, line in enumerate(lines) if line[:5] != b"step="]
        start, base = 0, self.r.lines
        for end in [*others, len(lines)]:
            if end > start:
                if self.on_event:
                    self._step_events(lines[start:end], base + start + 1)
                self._steps(lines[start:end])
            if end < len(lines):
                self.r.lines = base + end + 1
                self._other(lines[end][:MAX_LINE].rstrip(b"\r").decode(errors="replace"))
            start = end + 1
        self.r.lines = base + len(lines)

    # ---- step lines ----
    def _step_events(self, seg: list[bytes], first_line: int) -> None:
        for i, line in enumerate(seg):
            m = STEP.match(line)
            step, dt = (int(m["step"]), float(m["dt"])) if m else self._loose(line)
            self.on_event(StepEvent(self.worker, step, dt, first_line + i))  # type: ignore[misc]

    def _loose(self, line: bytes) -> tuple[int | None, float | None]:
        """A `step=` line that is not the trainer's (no `dt=`): its step and any duration key it has."""
        text = line.decode(errors="replace")
        m = STEP_ANY.match(text)
        if m is None:
            return None, None
        d = DT_ANY.search(text, m.end())
        return int(m["step"]), _seconds(d["dt"], d["unit"]) if d else None

    def _steps(self, seg: list[bytes]) -> None:
        if self._miss is not None or self._tb is not None:
            self._end_blocks()
        while seg and self.r.steps < self.warmup:
            self._one_step(seg[0], steady=False)
            seg = seg[1:]
        if not seg:
            return
        try:
            dts = [line.split(b" ", 5)[4] for line in seg]
            last = int(seg[-1][5 : seg[-1].index(b" ")])
            first = int(seg[0][5 : seg[0].index(b" ")])
            # Every fifth field is `dt=...` (tokens hold no space, so each " dt=" starts one), else these are
            # someone else's `step=` lines: the careful path reads them.
            if b" ".join([b"", *dts]).count(b" dt=") != len(dts):
                raise ValueError
        except (IndexError, ValueError):
            for line in seg:  # a malformed line somewhere: the careful path, line by line
                self._one_step(line, steady=True)
            return
        self._close_window(first)
        if self.r.first_step is None:
            self.r.first_step = first
        self._dt.update(dts)
        stride = self.r.row_stride
        self._rows.extend(seg[(stride - self.r.steps % stride) % stride :: stride])
        self.r.steps += len(seg)
        self.r.last_step = last
        self._last_row = seg[-1]
        self._trim()

    def _one_step(self, line: bytes, steady: bool) -> None:
        m = STEP.match(line)
        if m is None:
            text = line[:MAX_LINE].rstrip(b"\r").decode(errors="replace")
            if (loose := STEP_ANY.match(text)) is None:
                self.r.malformed_steps += 1
                return
            self._step_line(loose, text, event=False)  # its event went out with the segment's
            return
        step = int(m["step"])
        self._close_window(step)
        if self.r.first_step is None:
            self.r.first_step = step
        if steady:
            self._dt[b"dt=" + m["dt"] + b"s"] += 1
        if self.r.steps % self.r.row_stride == 0:
            self._rows.append(line)
        self.r.steps += 1
        self.r.last_step = step
        self._last_row = line
        self._trim()

    def _step_line(self, m: re.Match[str], text: str, *, event: bool = True) -> None:
        """A step line other than the trainer's (STEP_ANY or the user's step_pattern): the step from group
        `step`; its duration from group `dt`, else a duration key after the step, else the gap since the
        previous step line (logging timestamps, else the clock)."""
        try:
            step = int(m["step"])
        except (TypeError, ValueError):
            self.r.malformed_steps += 1
            return
        dt = _duration(m["dt"]) if self._dt_group and m["dt"] else None
        if dt is None and (d := DT_ANY.search(text, m.end())):
            dt = _seconds(d["dt"], d["unit"])
        if dt is None and self._stamped and self._last_match is not None:  # timestamps read only when needed
            before, now = _stamp(self._last_match), _stamp(m)
            if before is not None and now is not None and now >= before:
                dt = round(now - before, 4)
        self._last_match = m
        own = dt  # what the line itself says (its event's dt): a live consumer has its own clock
        if dt is None and self._at is not None and len(self.seen) < MAX_SEEN:
            self.seen.setdefault(step, self._at)
        if dt is None and self.seen and self.r.last_step is not None:
            before, now = self.seen.get(self.r.last_step), self.seen.get(step)
            if before is not None and now is not None and now > before:
                dt = round(now - before, 4)
        if self.clock is not None:
            seen = self.clock()
            if dt is None and self._last_seen is not None and seen >= self._last_seen:
                dt = own = round(seen - self._last_seen, 4)
            self._last_seen = seen
        self._close_window(step)
        if self.r.first_step is None:
            self.r.first_step = step
        if dt is not None and self.r.steps >= self.warmup:
            self._dt[round(dt, 6)] += 1
        row = (step, dt, text[m.end() :])
        if self.r.steps % self.r.row_stride == 0:
            self._rows.append(row)
        self.r.steps += 1
        self.r.last_step = step
        self._last_row = row
        self._trim()
        if event and self.on_event:
            self.on_event(StepEvent(self.worker, step, own, self.r.lines))

    def _trim(self) -> None:
        while len(self._rows) > MAX_ROWS:  # keep every 2^k-th step: uniform, and the same in any chunking
            self._rows = self._rows[::2]
            self.r.row_stride *= 2
        if len(self._dt) > MAX_DT_KEYS:
            for k, c in self._dt.items():
                v = _dt_value(k)
                if v is not None:
                    self._dt_coarse[float(f"{v:.4g}")] += c
            self._dt.clear()

    def _close_window(self, step: int) -> None:
        """A step= line ends the window: its compiles belong to that step (warm-up or not)."""
        c = self.r.compiles
        if not c["open"]:
            return
        warm = self.r.steps < self.warmup
        n_pending = c["open"]
        for comp in self._pending:
            comp.step = step
            if not warm and len(self.r.recompiles) < MAX_EVENTS:
                self.r.recompiles.append(comp)
        c["warmup" if warm else "after_warmup"] += n_pending
        if step in self.r.compiles_by_step or len(self.r.compiles_by_step) < 10 * MAX_EVENTS:
            self.r.compiles_by_step[step] = self.r.compiles_by_step.get(step, 0) + n_pending
        c["open"] = 0
        self._pending = []

    # ---- everything else ----
    def _other(self, text: str) -> None:
        if self._miss is not None:
            if text[:1].isspace() and len(self._miss) < EXPLAIN_LINES:
                self._miss.append(text)
                return
            self._end_miss()
        if self._tb is not None and self._traceback_line(text):
            return
        if self.step_pattern is not None:
            step = self.step_pattern.search(text)
        else:
            step = STEP_ANY.match(text) if "tep" in text else None
        if step is not None:
            self._step_line(step, text)
            return
        if m := COMPILE.search(text):
            self._compile(m["fn"])
        elif CACHE_HIT.search(text):
            self.r.cache_hits += 1
        elif CACHE_MISS.search(text):
            self._miss = [text[text.index("TRACING CACHE MISS") :]]
        elif TRACEBACK.match(text):
            self._tb = {"frame": "", "code": ""}
        elif m := RECORD.match(text):
            self._record(m["kind"], text)
        elif m := JSON_LINE.match(text):
            self._json(m["kind"], m["json"])
        elif m := CONFIG_SUMMARY.match(text):
            self.r.config_summary = kv(m["kv"])
        elif m := WANDB_URL.match(text):
            self.r.wandb_url = m["url"]
        elif m := WANDB_STATE.match(text):
            self.r.wandb = m["state"]
        for kind, pattern in FAILURES if FAILURE_HINT.search(text) else ():
            if pattern.search(text):
                self._fail(Failure(kind, text.strip()[:500], line=self.r.lines, worker=self.worker))

    # ---- output ----
    def report(self) -> LogReport:
        """A snapshot (the scanner keeps going): steady-state statistics, kept rows, open compile window."""
        r = self.r
        parsed = [p for line in self._rows if (p := parse(line))]
        if (
            self._last_row is not None
            and (last := parse(self._last_row))
            and (not parsed or parsed[-1][0].step != last[0].step)
        ):
            parsed.append(last)
        rows = [row for row, _ in parsed]
        names: dict[str, None] = {}
        for _, order in parsed:
            names.update((n, None) for n in order if len(names) < MAX_FIELDS)
        counts: Counter[float] = Counter(self._dt_coarse)
        for k, c in self._dt.items():
            v = _dt_value(k)
            if v is not None:
                counts[v] += c
        steady = [x for j, x in enumerate(rows) if j * r.row_stride >= self.warmup]
        out = copy.deepcopy(r)
        out.rows, out.dt, out.fields = rows, Stats.of(counts), list(names)
        own = [s for row in rows if (s := chip_sample(row.step, vars(row)))]
        if own:  # this worker's step lines carried its chips (process 0)
            out.chips[self.worker] = own
        out.tokens_per_s_mean = mean([x.tokens_per_s for x in steady])
        out.rollout_generate_mean = mean([x.rollout_generate for x in steady])
        out.update_mean = mean([x.update for x in steady])
        if self._exit is not None:
            apply_exit(out, self.worker, self._exit[0])
        return out
