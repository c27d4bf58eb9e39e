"""What the log scanner hands out: typed events (step, compile, failure, exit) and the LogReport they add up to."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal, NotRequired, Required, TypedDict

# Failure kinds from the most specific to the least: the first one present is the run's cause (an OOM
# inside a traceback is an OOM; a traceback says more than "exited 1"). Unknown kinds rank last.
RANK = ("oom", "tpu_busy", "multihost", "wandb_init", "traceback", "exit_code", "no_exit_file")
MAX_EVENTS = 200  # recompiles, failures, evals, metrics kept (counts stay exact)
PER_WORKER = ("exit_code", "no_exit_file")  # at most one per worker: kept even past MAX_EVENTS


@dataclass(frozen=True)
class StepEvent:
    """A `step=` line: step and dt are None when the line is malformed (it still says a step finished)."""

    worker: int
    step: int | None
    dt: float | None
    line: int


@dataclass(frozen=True)
class ExitEvent:
    """A worker's job ended: its exit file holds `code`."""

    worker: int
    code: int


@dataclass
class StepRow:
    step: int
    dt: float | None = None
    rollout_generate: float | None = None
    update: float | None = None
    reward_mean: float | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    # The learning signals of the step line (docs/trainer.md "The step line"); None where a line lacks them.
    reward_delta: float | None = None
    entropy: float | None = None
    grad_norm: float | None = None
    kl_old: float | None = None
    clip_frac: float | None = None
    # Process 0's chips (docs/contracts.md): HBM in use min/max over its local chips, peak, the smallest chip's
    # HBM, duty cycle min/max in percent; None where the backend exposes none (CPU) or older logs.
    hbm_gb_min: float | None = None
    hbm_gb_max: float | None = None
    hbm_gb_peak: float | None = None
    hbm_gb_limit: float | None = None
    duty_pct_min: float | None = None
    duty_pct_max: float | None = None
    hbm_gb_chips: list[float] | None = None  # per chip, in the process's device order
    duty_pct_chips: list[float] | None = None
    # The line's other numeric fields (a user's `acc=0.91 lr=1e-4`), by the line's names (logs/fields.py).
    extra: dict[str, float] = field(default_factory=dict)


ChipField = Literal["hbm_gb_min", "hbm_gb_max", "hbm_gb_peak", "hbm_gb_limit", "duty_pct_min", "duty_pct_max"]
ChipList = Literal["hbm_gb_chips", "duty_pct_chips"]
CHIP_FIELDS: tuple[ChipField, ...] = (
    "hbm_gb_min", "hbm_gb_max", "hbm_gb_peak", "hbm_gb_limit", "duty_pct_min", "duty_pct_max"
)  # fmt: skip
CHIP_LISTS: tuple[ChipList, ...] = ("hbm_gb_chips", "duty_pct_chips")
MAX_CHIP_SAMPLES = 2048  # per worker; every other one is dropped when full (the series keeps its span)


class Chips(TypedDict, total=False):
    """One worker's chips (StepRow's chip fields): only the fields its line carried."""

    hbm_gb_min: float
    hbm_gb_max: float
    hbm_gb_peak: float
    hbm_gb_limit: float
    duty_pct_min: float
    duty_pct_max: float
    hbm_gb_chips: list[float]
    duty_pct_chips: list[float]


class ChipSample(Chips, total=False):
    """One worker's chips at a step."""

    step: Required[int]


def chip_fields(sample: ChipSample) -> Chips:
    """A sample's chips without its step."""
    out: Chips = {}
    for k in CHIP_FIELDS:
        if k in sample:
            out[k] = sample[k]
    for n in CHIP_LISTS:
        if n in sample:
            out[n] = sample[n]
    return out


def chip_sample(step: int, values: Mapping[str, object]) -> ChipSample | None:
    """One worker's chips at a step, from a step row's or a `chips:` line's fields (numbers only: a field
    that is not one is left out); None when it has none."""
    out: ChipSample = {"step": step}
    for k in CHIP_FIELDS:
        if isinstance(v := values.get(k), int | float):
            out[k] = v
    for n in CHIP_LISTS:
        if isinstance(vs := values.get(n), list):
            out[n] = vs
    return out if len(out) > 1 else None


def add_chip_sample(series: list[ChipSample], sample: ChipSample) -> None:
    series.append(sample)
    if len(series) > MAX_CHIP_SAMPLES:
        del series[:-1:2]


class CompileCache(TypedDict):
    """What JAX's persistent compilation cache gave a run (`LogReport.compile_cache`)."""

    hits: int
    saved_s: float | None
    off: NotRequired[bool]


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


Event = (
    StepEvent | Compile | Failure | ExitEvent
)  # compiles are handed out when seen (step None: window open)


@dataclass
class Stats:
    n: int
    mean: float
    p50: float
    p90: float
    min: float
    max: float

    @classmethod
    def of(cls, counts: dict[float, int]) -> Stats | None:
        """Exact statistics of a multiset given as value -> count (numpy's linear quantiles)."""
        n = sum(counts.values())
        if not n:
            return None
        pairs = sorted(counts.items())
        avg = sum(v * c for v, c in pairs) / n
        return cls(n, avg, quantile(pairs, n, 0.5), quantile(pairs, n, 0.9), pairs[0][0], pairs[-1][0])


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
    # The numeric fields of the step lines in the order first seen (`dt` where the duration is); what the steps
    # table, the live rows and the page show: the first few, or `columns` when the user chose them.
    fields: list[str] = field(default_factory=list)
    columns: list[str] | None = None
    compiles: dict[str, int] = field(default_factory=dict)  # total, warmup, eval, after_warmup, open
    compiles_by_step: dict[int, int] = field(default_factory=dict)
    recompiles: list[Compile] = field(default_factory=list)
    cache_hits: int = 0  # JAX's `Persistent compilation cache hit for ...` lines
    # Each `eval:` line's key=value pairs.
    evals: list[dict[str, int | float | str]] = field(default_factory=list)
    checkpoints: int = 0
    last_checkpoint: str | None = None
    last_checkpoint_step: int | None = (
        None  # the step the last checkpoint saved (its `checkpoint step=N` line)
    )
    wandb_url: str | None = None
    wandb: str | None = None
    start: dict[str, str] = field(default_factory=dict)
    batch: dict[str, str] = field(default_factory=dict)
    config: dict[str, object] | None = None  # the full config: `config: {json}` (older logs) or config.json
    config_summary: dict[str, str] = field(default_factory=dict)  # the `config: key=value ...` line
    summary: dict[str, object] | None = None  # the trainer's `summary: {json}` line
    metrics: list[dict[str, object]] = field(default_factory=list)  # `metrics: {json}` lines
    reward_errors: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    failure_counts: dict[str, int] = field(default_factory=dict)
    exit_codes: dict[int, int | None] = field(default_factory=dict)  # None: no exit file (killed/preempted)
    # worker -> its chips over time (worker 0: from its step lines; the others: their `chips:` lines)
    chips: dict[int, list[ChipSample]] = field(default_factory=dict)

    @property
    def hbm_peak_gb(self) -> float | None:
        """The most HBM any chip of any worker held (its peak when logged, else its in-use maximum)."""
        vals = [s.get("hbm_gb_peak", s.get("hbm_gb_max")) for ss in self.chips.values() for s in ss]
        nums = [v for v in vals if isinstance(v, int | float)]
        return max(nums) if nums else None

    @property
    def hbm_limit_gb(self) -> float | None:
        nums = [v for ss in self.chips.values() for s in ss if (v := s.get("hbm_gb_limit")) is not None]
        return min(nums) if nums else None

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

    @property
    def compile_cache(self) -> CompileCache | None:
        """Programs JAX read from its persistent compilation cache: the trainer's summary counts them (and the
        compile seconds saved); another job's log, when it logs compiles, by JAX's cache-hit lines. None: the
        log does not say."""
        s = self.summary or {}
        if isinstance(hits := s.get("compile_cache_hits"), int):
            saved = s.get("compile_cache_saved_s")
            return {"hits": hits, "saved_s": saved if isinstance(saved, int | float) else None}
        if s.get("compile_cache") == "off":
            return {"hits": 0, "saved_s": None, "off": True}
        return {"hits": self.cache_hits, "saved_s": None} if self.cache_hits else None

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = asdict(self)
        cause = self.cause()
        data["cause"] = None if cause is None else asdict(cause)
        data["compiles_by_step"] = {str(k): v for k, v in self.compiles_by_step.items()}
        data["exit_codes"] = {str(k): v for k, v in self.exit_codes.items()}
        data["chips"] = {str(k): v for k, v in self.chips.items()}
        data["hbm_peak_gb"] = self.hbm_peak_gb
        data["compile_cache"] = self.compile_cache
        return data

    def add_failure(self, f: Failure) -> None:
        self.failure_counts[f.kind] = self.failure_counts.get(f.kind, 0) + 1
        if len(self.failures) < MAX_EVENTS or f.kind in PER_WORKER:
            self.failures.append(f)


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


NOSPACE = "nospace"  # exit-file note: the disk was full when the job ended (its log may be cut short)
STOPPED = "stopped"  # exit-file note: `tpuops stop` (or `--force`) ended the job
NOTICE = "notice"  # exit-file note: the VM's preemption notice came while the job ran (sop/notice.py)


def exit_status(text: str | bytes | None) -> tuple[int | None, tuple[str, ...]]:
    """A `worker-<k>.exit` file's code and notes (`143 stopped`, `0 nospace`); (None, ()) when absent or
    unreadable. The file is one line, padded with spaces (written over reserved bytes: sop/claim.py)."""
    if text is None:
        return None, ()
    words = (text.decode(errors="replace") if isinstance(text, bytes) else text).split()
    try:
        return int(words[0]), tuple(words[1:])
    except (IndexError, ValueError):
        return None, ()


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
        for w, series in r.chips.items():
            out.chips.setdefault(w, list(series))
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


def mean(values: list[float | None]) -> float | None:
    """The mean of the values present (None: missing from that step line)."""
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def at_step(step: int | None) -> str:
    """Where a run stood as process 0's step lines said: "at step 7", or "before its first step line"."""
    return "before its first step line" if step is None else f"at step {step}"
