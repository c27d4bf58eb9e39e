"""Pure streaming parser of trainer and JAX logs: lines -> LogReport, in constant memory, never printing."""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# ---- The regex table: every line shape we read (docs/contracts.md section 2, JAX's compile logging) ----
STEP = re.compile(rb"^step=(?P<step>-?\d+) .*?\bdt=(?P<dt>[0-9.]+)s")
KV = re.compile(r"(?P<k>[A-Za-z_][\w.]*)=(?P<v>\S+)")
RECORD = re.compile(r"^(?P<kind>start|batch|eval_begin|eval_end|eval|checkpoint|reward_errors)(?::|\s|$)")
JSON_LINE = re.compile(r"^(?P<kind>summary|metrics|config): (?P<json>\{.*\})\s*$")
WANDB_URL = re.compile(r"^wandb: (?:url=|.*?View run .*?at:? )(?P<url>https?://\S+)")
WANDB_STATE = re.compile(r"^wandb: (?P<state>mode=\S+.*|disabled)\s*$")
# jax >= 0.4.36 "Compiling jit(f) with global shapes ..."; 0.4.1x-0.4.35 "Compiling f for with global shapes";
# older "Compiling f (1403...) for args". "Compiling module X with FDO profile" repeats a compile: skipped.
COMPILE = re.compile(r"Compiling (?!module )(?P<fn>\S+?)(?: \(\d+\))? (?:for|with)\b")
CACHE_MISS = re.compile(r"TRACING CACHE MISS at (?P<site>.*?)(?: because)?:\s*$")
MISS_FN = re.compile(r"^\s+(?:for (?P<fn>\S+)|(?P<unseen>\S+) id=\d+)")
TRACEBACK = re.compile(r"^Traceback \(most recent call last\):")
FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>.+)$')
FAILURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("oom", re.compile(r"RESOURCE_EXHAUSTED|[Oo]ut of memory|OOM when allocating")),
    (
        "tpu_busy",
        re.compile(
            r"TPU.*already in use|already in use.*TPU|TPU is held|libtpu_lockfile.*held"
            r"|/dev/(?:vfio|accel)\S*.*[Bb]usy|[Bb]usy.*/dev/(?:vfio|accel)"
        ),
    ),
    (
        "wandb_init",
        re.compile(r"^wandb: ERROR|wandb\.errors\.\w+|Run initialization has timed out|api_key not conf"),
    ),
    (
        "multihost",
        re.compile(
            r"[Bb]arrier timed out|RegisterTask|[Ff]ailed to connect to (?:the )?coordinat|missing heartbeats"
            r"|[Cc]oordination service.*(?:UNAVAILABLE|[Uu]navailable|DEADLINE|[Dd]eadline|timed out)"
            r"|has not (?:joined|connected)"
        ),
    ),
)
# Each FAILURES pattern contains one of these literals: one cheap search first (most other lines are noise).
FAILURE_HINT = re.compile(
    r"RESOURCE_EXHAUSTED|ut of memory|OOM when|already in use|TPU is held|libtpu_lockfile|/dev/vfio"
    r"|/dev/accel|wandb|Run initialization|api_key|arrier timed out|RegisterTask|oordinat|heartbeats|has not"
)
# Failure kinds from the most specific to the least: the first one present is the run's cause (an OOM
# inside a traceback is an OOM; a traceback says more than "exited 1"). Unknown kinds rank last.
RANK = ("oom", "tpu_busy", "multihost", "wandb_init", "traceback", "exit_code", "no_exit_file")
WORKER_LOG = re.compile(r"^worker-(?P<k>\d+)\.log$")

MAX_ROWS = 4096  # step rows kept for tables and plots: every 2^k-th step once a log has more
MAX_EVENTS = 200  # recompiles, failures, evals, metrics kept (counts stay exact)
MAX_DT_KEYS = 50_000  # distinct dt values before they are rounded to 4 significant digits
MAX_LINE = 1 << 20  # longer lines are cut (a binary blob in a log must not blow the memory)
EXPLAIN_LINES = 40
PER_WORKER = ("exit_code", "no_exit_file")  # at most one per worker: kept even past MAX_EVENTS


@dataclass
class StepRow:
    step: int
    dt: float | None = None
    rollout_generate: float | None = None
    update: float | None = None
    reward_mean: float | None = None
    loss: float | None = None
    tokens_per_s: float | None = None


@dataclass
class Compile:
    step: int | None  # the step whose window it fell in (None: after the last step line so far)
    function: str
    explanation: str | None
    line: int
    worker: int = 0


@dataclass
class Failure:
    kind: str  # traceback, oom, tpu_busy, wandb_init, multihost, exit_code, no_exit_file
    message: str
    detail: str = ""
    line: int = 0
    worker: int = 0


@dataclass
class Stats:
    n: int
    mean: float
    p50: float
    p90: float
    min: float
    max: float


@dataclass
class LogReport:
    source: str = ""
    workers: list[int] = field(default_factory=lambda: [0])
    warmup: int = 1
    lines: int = 0
    steps: int = 0
    first_step: int | None = None
    last_step: int | None = None
    row_stride: int = 1
    rows: list[StepRow] = field(default_factory=list)
    dt: Stats | None = None  # steady state: steps from the warm-up on
    # Steady-state means over the kept rows: exact up to MAX_ROWS steps, then every row_stride-th step.
    rollout_generate_mean: float | None = None
    update_mean: float | None = None
    tokens_per_s_mean: float | None = None
    malformed_steps: int = 0
    compiles: dict[str, int] = field(default_factory=dict)  # total, warmup, eval, after_warmup, open
    compiles_by_step: dict[int, int] = field(default_factory=dict)
    recompiles: list[Compile] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: int = 0
    last_checkpoint: str | None = None
    wandb_url: str | None = None
    wandb: str | None = None
    start: dict[str, str] = field(default_factory=dict)
    batch: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    reward_errors: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    failure_counts: dict[str, int] = field(default_factory=dict)
    exit_codes: dict[int, int | None] = field(default_factory=dict)  # None: no exit file (killed/preempted)

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    def cause(self) -> Failure | None:
        """The most specific failure (RANK), the earliest of its kind: what the exit code is made from."""
        if not self.failures:
            return None
        return min(self.failures, key=lambda f: RANK.index(f.kind) if f.kind in RANK else len(RANK))

    @property
    def recompiled(self) -> bool:
        return self.compiles.get("after_warmup", 0) > 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        cause = self.cause()
        data["cause"] = None if cause is None else asdict(cause)
        data["compiles_by_step"] = {str(k): v for k, v in self.compiles_by_step.items()}
        data["exit_codes"] = {str(k): v for k, v in self.exit_codes.items()}
        return data

    def add_failure(self, f: Failure) -> None:
        self.failure_counts[f.kind] = self.failure_counts.get(f.kind, 0) + 1
        if len(self.failures) < MAX_EVENTS or f.kind in PER_WORKER:
            self.failures.append(f)


def _kv(text: str) -> dict[str, str]:
    return {m["k"]: m["v"] for m in KV.finditer(text)}


def _num(v: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(v.removesuffix("s"))
        except ValueError:
            pass
    return v


def quantile(sorted_counts: list[tuple[float, int]], n: int, q: float) -> float:
    """numpy.quantile's default (linear) of the multiset given as sorted (value, count) pairs."""
    h = (n - 1) * q
    lo = int(h)
    below, lo_v, hi_v = 0, None, None
    for v, c in sorted_counts:
        if lo_v is None and lo < below + c:
            lo_v = v
        if lo + 1 < below + c:
            hi_v = v
            break
        below += c
    lo_v = sorted_counts[-1][0] if lo_v is None else lo_v
    hi_v = lo_v if hi_v is None else hi_v
    return lo_v + (hi_v - lo_v) * (h - lo)


def _dt_value(key: bytes | float) -> float | None:
    if isinstance(key, float):
        return key
    if key[:3] != b"dt=" or key[-1:] != b"s":
        return None
    try:
        return float(key[3:-1])
    except ValueError:
        return None


def _row(line: bytes) -> StepRow | None:
    kv = _kv(line.decode(errors="replace"))
    try:
        row = StepRow(step=int(kv["step"]))
    except (KeyError, ValueError):
        return None
    for name in ("dt", "rollout_generate", "update", "reward_mean", "loss", "tokens_per_s"):
        v = _num(kv[name]) if name in kv else None
        setattr(row, name, float(v) if isinstance(v, int | float) else None)
    return row


class LogScanner:
    """Feed lines (live) or bytes (files); `report()` at any time. Memory is bounded whatever the log size."""

    def __init__(self, warmup: int = 1, worker: int = 0, source: str = "") -> None:
        self.warmup = warmup
        self.r = LogReport(source=source, workers=[worker], warmup=warmup)
        self.r.compiles = {"total": 0, "warmup": 0, "eval": 0, "after_warmup": 0, "open": 0}
        self.worker = worker
        self._dt: Counter[bytes] = Counter()  # steady-state dt tokens (b"dt=1.23s") -> count
        self._dt_coarse: Counter[float] = Counter()
        self._rows: list[bytes] = []
        self._last_row: bytes | None = None
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

    def feed_bytes(self, data: bytes) -> None:
        """A chunk of a file; a trailing partial line waits for the next chunk or `close()`."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE:
            self._partial = self._partial[:MAX_LINE]
        self._lines(lines)

    def close(self) -> LogReport:
        """End of input: the last partial line counts, and a traceback cut off by the end is reported."""
        if self._partial:
            self._lines([self._partial])
            self._partial = b""
        self._end_blocks()
        return self.report()

    def _lines(self, lines: list[bytes]) -> None:
        # Fast path: runs of step= lines are counted in bulk; only the other lines go through the regex table.
        others = [i for i, line in enumerate(lines) if line[:5] != b"step="]
        start, base = 0, self.r.lines
        for end in [*others, len(lines)]:
            if end > start:
                self._steps(lines[start:end])
            if end < len(lines):
                self.r.lines = base + end + 1
                self._other(lines[end][:MAX_LINE].rstrip(b"\r").decode(errors="replace"))
            start = end + 1
        self.r.lines = base + len(lines)

    # ---- step lines ----
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
            self.r.malformed_steps += 1
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
        if m := COMPILE.search(text):
            self._compile(m["fn"])
        elif CACHE_MISS.search(text):
            self._miss = [text[text.index("TRACING CACHE MISS") :]]
        elif TRACEBACK.match(text):
            self._tb = {"frame": "", "code": ""}
        elif m := RECORD.match(text):
            self._record(m["kind"], text)
        elif m := JSON_LINE.match(text):
            self._json(m["kind"], m["json"])
        elif m := WANDB_URL.match(text):
            self.r.wandb_url = m["url"]
        elif m := WANDB_STATE.match(text):
            self.r.wandb = m["state"]
        for kind, pattern in FAILURES if FAILURE_HINT.search(text) else ():
            if pattern.search(text):
                self.r.add_failure(Failure(kind, text.strip()[:500], line=self.r.lines, worker=self.worker))

    def _end_blocks(self) -> None:
        if self._miss is not None:
            self._end_miss()
        if self._tb is not None:
            self._traceback_line("")

    def _compile(self, fn: str) -> None:
        name = fn[fn.index("(") + 1 : -1] if fn.endswith(")") and "(" in fn else fn
        c = self.r.compiles
        c["total"] += 1
        if self._in_eval:
            c["eval"] += 1
            return
        explanation = self._explain.pop(name, None)
        c["open"] += 1
        if len(self._pending) < MAX_EVENTS:
            self._pending.append(Compile(None, name, explanation, self.r.lines, self.worker))

    def _end_miss(self) -> None:
        lines, self._miss = self._miss or [], None
        for text in lines[1:]:
            if m := MISS_FN.match(text):
                name = m["fn"] or m["unseen"]
                if len(self._explain) > 64:
                    self._explain.pop(next(iter(self._explain)))
                self._explain[name] = "\n".join(lines)[:4000]
                return

    def _traceback_line(self, text: str) -> bool:
        """In a traceback: keep the last frame; the first unindented line is the error. True: consumed."""
        tb = self._tb or {}
        if m := FRAME.match(text):
            tb["frame"], tb["code"] = f"{m['file']}:{m['line']} in {m['fn']}", ""
            return True
        if text[:1].isspace():
            if tb["frame"] and not tb["code"] and text.strip() and set(text.strip()) - set("^~ "):
                tb["code"] = text.strip()
            return True
        self._tb = None
        detail = tb["frame"] + (f": {tb['code']}" if tb["code"] else "")
        message = text.strip() or "(traceback without an error line: the log ends inside it)"
        self.r.add_failure(Failure("traceback", message[:500], detail, self.r.lines, self.worker))
        return False

    def _record(self, kind: str, text: str) -> None:
        r = self.r
        if kind == "eval_begin":
            self._in_eval = True
        elif kind == "eval_end":
            self._in_eval = False
        elif kind == "eval":
            if len(r.evals) < MAX_EVENTS:
                r.evals.append({k: _num(v) for k, v in _kv(text).items()})
        elif kind == "checkpoint":
            r.checkpoints += 1
            r.last_checkpoint = _kv(text).get("path")
        elif kind == "reward_errors":
            kv = _kv(text)
            name = kv.get("name", "?")
            count = _num(kv.get("count", "1"))
            r.reward_errors[name] = r.reward_errors.get(name, 0) + (
                int(count) if isinstance(count, int) else 1
            )
        elif kind in ("start", "batch"):
            setattr(r, kind, _kv(text))

    def _json(self, kind: str, raw: str) -> None:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            return
        if kind == "metrics":
            if len(self.r.metrics) < MAX_EVENTS:
                self.r.metrics.append(data)
        else:
            setattr(self.r, kind, data)

    # ---- output ----
    def report(self) -> LogReport:
        """A snapshot (the scanner keeps going): steady-state statistics, kept rows, open compile window."""
        r = self.r
        rows = [row for line in self._rows if (row := _row(line))]
        if (
            self._last_row is not None
            and (last := _row(self._last_row))
            and (not rows or rows[-1].step != last.step)
        ):
            rows.append(last)
        counts: Counter[float] = Counter(self._dt_coarse)
        for k, c in self._dt.items():
            v = _dt_value(k)
            if v is not None:
                counts[v] += c
        n = sum(counts.values())
        dt = None
        if n:
            pairs = sorted(counts.items())
            mean = sum(v * c for v, c in pairs) / n
            dt = Stats(n, mean, quantile(pairs, n, 0.5), quantile(pairs, n, 0.9), pairs[0][0], pairs[-1][0])
        steady = [x for j, x in enumerate(rows) if j * r.row_stride >= self.warmup]
        out = copy.deepcopy(r)
        out.rows, out.dt = rows, dt
        out.tokens_per_s_mean = _mean([x.tokens_per_s for x in steady])
        out.rollout_generate_mean = _mean([x.rollout_generate for x in steady])
        out.update_mean = _mean([x.update for x in steady])
        return out


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


# ---- files, runs and baselines ----
def scan_file(
    path: str | Path, warmup: int = 1, *, worker: int | None = None, check_exit: bool | None = None
) -> LogReport:
    """Scan one log in 4 MiB chunks. For `worker-<k>.log` the `worker-<k>.exit` beside it is the exit code."""
    path = Path(path)
    named = WORKER_LOG.match(path.name)
    k = worker if worker is not None else int(named["k"]) if named else 0
    scanner = LogScanner(warmup, k, str(path))
    with path.open("rb") as f:
        while data := f.read(1 << 22):
            scanner.feed_bytes(data)
    report = scanner.close()
    if check_exit if check_exit is not None else bool(named):
        apply_exit(report, k, read_exit(path.with_suffix(".exit")))
    return report


def read_exit(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def apply_exit(report: LogReport, worker: int, code: int | None) -> None:
    """Record a worker's exit code; a missing exit file means the job was killed (or the VM preempted)."""
    report.exit_codes[worker] = code
    if code is None:
        msg = "no exit file: the job was killed or the VM preempted (or it is still running)"
        report.add_failure(Failure("no_exit_file", msg, worker=worker))
    elif code != 0:
        report.add_failure(Failure("exit_code", f"the job exited with code {code}", worker=worker))


def merge(reports: list[LogReport]) -> LogReport:
    """One report for a run: steps and compiles from the worker that printed step lines, failures from all."""
    primary = max(reports, key=lambda r: (r.steps, -r.workers[0]))
    out = copy.deepcopy(primary)
    out.workers = sorted(w for r in reports for w in r.workers)
    for r in reports:
        if r is primary:
            continue
        out.exit_codes.update(r.exit_codes)
        out.wandb_url = out.wandb_url or r.wandb_url
        for f in r.failures:
            out.add_failure(f)
        for kind, n in r.failure_counts.items():  # the ones beyond the kept list still count
            out.failure_counts[kind] = (
                out.failure_counts.get(kind, 0) + n - sum(f.kind == kind for f in r.failures)
            )
    joined = out.start.get("process_count", "")
    if len(reports) > 1 and joined.isdigit() and int(joined) < len(reports):
        msg = f"process_count={joined} but {len(reports)} workers ran: the processes did not join one job"
        out.add_failure(Failure("multihost", msg, worker=primary.workers[0]))
    return out


def run_logs(run_dir: Path) -> list[Path]:
    logs = [p for p in run_dir.glob("worker-*.log") if WORKER_LOG.match(p.name)]
    return sorted(logs, key=lambda p: int(WORKER_LOG.match(p.name)["k"]))  # type: ignore[index]


def scan_run(run_dir: Path, warmup: int = 1, *, check_exit: bool = True) -> LogReport:
    """Every `worker-<k>.log` of a run directory (with its `worker-<k>.exit` unless told not to), merged."""
    logs = run_logs(run_dir)
    if not logs:
        from tpuops.errors import UsageError

        raise UsageError(
            f"no worker-*.log in {run_dir}", hint="fetch the run's logs first, or pass a log file"
        )
    report = merge([scan_file(p, warmup, check_exit=check_exit) for p in logs])
    report.source = str(run_dir)
    return report


def scan_target(target: str, warmup: int = 1, runs_home: Path | None = None) -> LogReport:
    """LOGFILE, a run directory, or a RUN_ID under `<state home>/runs/`."""
    path = Path(target).expanduser()
    if path.is_file():
        return scan_file(path, warmup)
    if path.is_dir():
        return scan_run(path, warmup)
    if runs_home is None:
        from tpuops.config import state_home

        runs_home = state_home() / "runs"
    if (runs_home / target).is_dir():
        return scan_run(runs_home / target, warmup)
    from tpuops.errors import UsageError

    raise UsageError(f"{target!r} is neither a log file nor a run in {runs_home}", hint="see `tpuops runs`")


# Baseline metrics: (dotted key in to_dict(), +1 if higher is worse, -1 if lower is worse).
BASELINE_KEYS: tuple[tuple[str, int], ...] = (
    ("dt.mean", 1),
    ("dt.p50", 1),
    ("dt.p90", 1),
    ("rollout_generate_mean", 1),
    ("update_mean", 1),
    ("tokens_per_s_mean", -1),
)


@dataclass
class Delta:
    metric: str
    baseline: float
    current: float
    change: float  # relative, signed: + is worse
    regressed: bool


def _get(data: dict[str, Any], dotted: str) -> float | None:
    cur: Any = data
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return float(cur) if isinstance(cur, int | float) else None


def compare(report: LogReport, baseline: dict[str, Any], threshold: float = 0.1) -> list[Delta]:
    """Relative change of each metric both reports have; regressed when worse by more than `threshold`."""
    base = baseline.get("report", baseline)  # accepts the --json output or a bare to_dict()
    now = report.to_dict()
    deltas = []
    for key, sign in BASELINE_KEYS:
        b, c = _get(base, key), _get(now, key)
        if b is None or c is None or b == 0:
            continue
        change = sign * (c - b) / abs(b)
        deltas.append(Delta(key, b, c, change, change > threshold))
    return deltas
