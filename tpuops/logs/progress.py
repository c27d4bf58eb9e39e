"""A run as the live view shows it: each worker's phase, step N/total, elapsed, steady s/step, ETA, reward trend."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

from tpuops.logs.events import StepRow
from tpuops.logs.fields import pick, value
from tpuops.logs.lines import config_summary, json_fields, step_row

# What a SOP step kind is doing, in the words of the status line (anything else: the step's title).
PHASES = {
    "git_sync": "syncing code",
    "python_env": "preparing venv",
    "clear_lockfile": "clearing TPU lock",
    "sync_env": "sending .env",
    "run": "starting",
    "follow": "running",
    "fetch_log": "fetching logs",
}
DONE = "done"
# How the compact step row shows a field: its header, format and width.
FORMATS = {
    "reward_mean": ("reward", "{:.4f}", 6),
    "reward_delta": ("Δ", "{:+.3f}", 6),
    "entropy": ("entropy", "{:.3f}", 7),
    "dt": ("dt", "{:.2f}s", 7),
    "kl_old": ("kl_old", "{:.2g}", 7),
    "clip_frac": ("clip", "{:.3f}", 5),
    "grad_norm": ("grad", "{:.3f}", 6),
    "tokens_per_s": ("tok/s", "{:.0f}", 6),
    "rollout_generate": ("generate", "{:.2f}s", 8),
    "update": ("update", "{:.2f}s", 7),
}


def column(name: str) -> tuple[str, str, int]:
    """A field's header, format and width in the compact row (any other field: its own name, 4 digits)."""
    return FORMATS.get(name, (name, "{:.4g}", max(len(name), 7)))


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


@dataclass
class Progress:
    """Fed the executor's phases (`phase`) and the followed log lines (`line`); `status()` is the one line the
    live view shows at the bottom, `line()` what it prints above it (a step line as a compact row). Thread-safe:
    workers report from their own threads."""

    started: float = field(default_factory=time.monotonic)
    total: int | None = None  # steps of the run (the trainer's `config:` line says)
    step: int | None = None  # the last step line's step
    phases: dict[int, str] = field(default_factory=dict)  # worker -> what it is doing now
    dts: list[float] = field(default_factory=list)  # dt of every step line, in order
    rewards: list[float] = field(default_factory=list)
    waiting_since: float | None = None  # when the job started and no step line had come yet
    columns: list[str] | None = (
        None  # the user's `--set columns=...`; else the first step line's first fields
    )
    shown: list[str] = field(default_factory=list)  # the columns of the rows printed so far
    header_shown: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def following(cls, started_at: float | None = None) -> Progress:
        """A run already started (attach): process 0's log is being followed; elapsed counts from the run's
        start (`started_at`, seconds since the epoch) when it is known. The lines shown before are fed through
        `past`, so the total, the step times and the ETA are there again."""
        p = cls()
        if started_at is not None:
            p.started = time.monotonic() - max(time.time() - started_at, 0.0)
        p.phase(0, "follow", "follow", "begin")
        return p

    def past(self, worker: int, text: str) -> None:
        """A line an earlier follow already showed (attach): it counts (total, steps, dt, reward), unprinted."""
        if worker != 0:
            return
        parsed = step_row(text)
        with self.lock:
            if parsed is None:
                summary = config_summary(text)
                if summary is not None:
                    self.total = int(summary["steps"]) if summary.get("steps", "").isdigit() else self.total
                    self.step, self.dts, self.rewards = None, [], []
                return
            row, _ = parsed
            self.step = row.step
            if row.dt is not None:
                self.dts.append(row.dt)
            if row.reward_mean is not None:
                self.rewards.append(row.reward_mean)

    def phase(self, worker: int, title: str, kind: str, state: str) -> None:
        """The executor's hook: a worker began a step ("begin") or ended it (its status)."""
        with self.lock:
            if state == "begin":
                self.phases[worker] = PHASES.get(kind, title)
                if kind == "follow":  # a job started: its first step line is awaited from now
                    self.waiting_since = time.monotonic()
            elif state.startswith("doing "):  # what a step is doing now (pip: the package it collects)
                self.phases[worker] = f"{PHASES.get(kind, title)}: {state.removeprefix('doing ')}"
            elif state in ("ok", "changed", "nothing", "skipped"):
                self.phases[worker] = (
                    "job ended" if kind == "follow" else f"{PHASES.get(kind, title)}: {DONE}"
                )
            else:
                self.phases[worker] = f"{PHASES.get(kind, title)}: {state}"

    def line(self, worker: int, text: str) -> str:
        """A followed log line as the live view prints it: a step line becomes a compact row (the header
        before the first one); the trainer's `config:` line gives the total; other lines unchanged."""
        parsed = step_row(text)
        with self.lock:
            if parsed is None:
                summary = config_summary(text)
                if summary is None:
                    return rounded_json(text)
                if summary.get("steps", "").isdigit():
                    self.total = int(summary["steps"])
                # A trainer starting: the next run of the same command (bench variants) counts afresh.
                self.step, self.dts, self.rewards, self.header_shown = None, [], [], False
                # The file's path is long and in the run directory anyway (`tpuops logs` shows the line whole).
                return "config: " + " ".join(f"{k}={v}" for k, v in summary.items() if k != "file")
            row, order = parsed
            self.step = row.step
            if row.dt is not None:
                self.dts.append(row.dt)
            if row.reward_mean is not None:
                self.rewards.append(row.reward_mean)
            first = not self.header_shown
            if first:  # the log's own fields, as its first step line has them (or the user's choice)
                self.shown = pick(order, self.columns)
            self.header_shown = True
        compact = self.row(row)
        return f"{self.header()}\n{compact}" if first else compact

    def header(self) -> str:
        width = len(self._step_cell(0))
        return "step".rjust(width) + "".join(f"  {h:>{w}}" for h, _, w in map(column, self.shown))

    def _step_cell(self, step: int) -> str:
        """`N/total` with N counted from 1 (the trainer's step=0 is 1/20), as the status line counts: one numbering.
        Without a total (a program of the user's), the log's own step number, in both."""
        if not self.total:
            return str(step)
        done = step + 1
        digits = max(len(str(self.total)), len(str(done)))
        return f"{done:>{digits}}/{self.total}"

    def row(self, row: StepRow) -> str:
        cells = []
        for name in self.shown:
            _, fmt, w = column(name)
            v = value(row, name)
            cells.append(f"  {'' if v is None else fmt.format(v):>{w}}")
        return self._step_cell(row.step) + "".join(cells)

    def steady_s_per_step(self) -> float | None:
        """The median dt of the steps after the first (the first one compiles); None before two steps."""
        return statistics.median(self.dts[1:]) if len(self.dts) > 1 else None

    def status(self, now: float | None = None, width: int | None = None) -> str:
        """The status line: what is going on, how far, how long, how long still, and where the reward goes.
        Within `width` columns: what is going on is cut first (with an ellipsis), then the reward and the
        s/step; the step, the elapsed time and the ETA always stay."""
        now = time.monotonic() if now is None else now
        with self.lock:
            parts = [self._doing(now), f"elapsed {_clock(now - self.started)}"]
            if self.step is not None:
                done = self.step + 1
                parts.insert(1, f"step {done}/{self.total}" if self.total else f"step {self.step}")
                rate = self.steady_s_per_step()
                if rate is not None:
                    parts.append(f"{rate:.2f} s/step")
                    if self.total:
                        parts.append(f"ETA {_clock(max(self.total - done, 0) * rate)}")
            if self.rewards:
                parts.append(self._trend())
        return fit_line(parts, width)

    def _doing(self, now: float) -> str:
        workers = sorted(self.phases)
        if not workers:  # launch checks the SOP, its values and the trainer's config before any step
            return "checking config"
        here = self.phases[workers[0]]
        if here == PHASES["follow"]:
            if self.step is not None and self.total and self.step + 1 >= self.total:
                here = "finishing (last step done)"
            elif self.step is not None:
                here = "stepping"
            elif self.total is not None:  # a trainer (its config line came) that has not finished step 0
                here = f"compiling (first step) {now - (self.waiting_since or now):.0f}s"
        if len(workers) == 1:
            return here
        others = {w: p for w, p in self.phases.items() if w != workers[0]}
        if all(p == self.phases[workers[0]] for p in others.values()):
            return f"{here} (w0-w{workers[-1]})"
        return f"w{workers[0]} {here}; " + ", ".join(f"w{w} {p}" for w, p in sorted(others.items()))

    def _trend(self) -> str:
        first, last = self.rewards[0], self.rewards[-1]
        recent = self.rewards[-5:]
        slope = recent[-1] - recent[0]
        arrow = "↑" if slope > 1e-9 else "↓" if slope < -1e-9 else "→"
        return f"reward {first:.2f} → {last:.2f} {arrow}"


SEP = " · "
KEEP = 12  # what is going on is never cut shorter than this


def fit_line(parts: list[str], width: int | None) -> str:
    """`parts` joined within `width`: the reward trend and the s/step are dropped first, then the first part
    (what is going on) is cut with an ellipsis; the step, the elapsed time and the ETA stay whole."""
    parts = list(parts)
    if width is None:
        return SEP.join(parts)
    droppable = [i for i, p in enumerate(parts) if p.startswith("reward ") or p.endswith(" s/step")]
    for i in reversed(droppable):
        if len(SEP.join(parts)) - len(parts[0]) + KEEP <= width:
            break
        del parts[i]
    room = width - len(SEP.join(parts[1:])) - len(SEP)
    if len(parts[0]) > room:
        parts[0] = parts[0][: max(room, KEEP) - 1].rstrip() + "…"
    return SEP.join(parts)


def rounded_json(text: str) -> str:
    """A `summary: {json}` line for people: `key=value` pairs, numbers to 4 significant digits (`dt_p50=0.215`,
    not 0.21500000000000002), nested values left out (`tpuops logs` shows the line whole); any other line as it is."""
    fields = json_fields(text)
    if fields is None:
        return text
    kind, data = fields
    shown = {k: f"{v:.4g}" if isinstance(v, float) else str(v) for k, v in data.items()
             if not isinstance(v, dict | list)}  # fmt: skip
    return f"{kind}: " + " ".join(f"{k}={v}" for k, v in shown.items())
