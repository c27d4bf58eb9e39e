"""The one regex table of log lines: every line shape tpuops reads (docs/contracts.md section 2, JAX's compile
logging) and the pure parse of one line (a step row, the config summary, a JSON line); no state, no printing."""

from __future__ import annotations

import functools
import json
import re

from tpuops.logs.events import StepRow
from tpuops.logs.fields import kv, parse

# ---- The regex table: every line shape we read (docs/contracts.md section 2, JAX's compile logging) ----
STEP = re.compile(rb"^step=(?P<step>-?\d+) .*?\bdt=(?P<dt>[0-9.]+)s")
# Step lines as people write them (docs/logs.md "Step lines"): an optional logging prefix (`INFO:root:`,
# `2026-01-20 12:00:01,123 INFO ...`, absl's `I0120 12:00:01.123456 1234 train.py:12] `), then `step=N`,
# `step: N`, `Step N/M` or `[step N]`. The bundled trainer's `step=` lines take the fast path (_lines).
_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
_PREFIX = (
    r"(?:(?P<absl>[IWEF](?P<amd>\d{4}) (?P<atime>\d\d:\d\d:\d\d(?:\.\d+)?) +\d+ [^\]\s]*\] ?)"
    rf"|{_LEVEL}:[\w.<>-]*:"
    r"|\[?(?P<date>\d{4}-\d\d-\d\d)[ T](?P<time>\d\d:\d\d:\d\d(?:[.,]\d+)?)\S*"
    r"(?:[^=\n]{0,120}?[\s\[\]:|-])?)"
)
STEP_ANY = re.compile(
    rf"^\s*{_PREFIX}?\[? *[Ss]tep(?: *[=:] *| +)(?P<step>\d+)(?: */ *\d+)?\]?(?=$|[\s,;|\]])"
)
# The step's duration, anywhere after the step number: `dt=1.2s`, `step_time: 1370ms`, `time=1.37`, ...
DT_ANY = re.compile(
    r"(?<![\w.])(?:dt|step_time|time|step_s|elapsed)(?:\s*[=:]\s*|\s+)"
    r"(?P<dt>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*(?P<unit>ms|s)?(?![\w.:-])"
)
RECORD = re.compile(
    r"^(?P<kind>start|batch|eval_begin|eval_end|eval|checkpoint|reward_errors|chips)(?::|\s|$)"
)
# `config: task=arith steps=20 ... file=PATH` (the summary; the JSON is in the file); older logs: `config: {json}`
CONFIG_SUMMARY = re.compile(r"^config: (?P<kv>[A-Za-z_]\w*=\S*(?: [A-Za-z_]\w*=\S*)*)\s*$")
JSON_LINE = re.compile(r"^(?P<kind>summary|metrics|config): (?P<json>\{.*\})\s*$")
WANDB_URL = re.compile(r"^wandb: (?:url=|.*?View run .*?at:? )(?P<url>https?://\S+)")
WANDB_STATE = re.compile(r"^wandb: (?P<state>mode=\S+.*|disabled)\s*$")
# jax >= 0.4.36 "Compiling jit(f) with global shapes ..."; 0.4.1x-0.4.35 "Compiling f for with global shapes";
# older "Compiling f (1403...) for args". "Compiling module X with FDO profile" repeats a compile: skipped.
COMPILE = re.compile(r"Compiling (?!module )(?P<fn>\S+?)(?: \(\d+\))? (?:for|with)\b")
# JAX's line for a program read from the persistent compilation cache (logged under jax_log_compiles; its
# `Compiling ...` line comes too, so a hit is still a compile to the recompile check).
CACHE_HIT = re.compile(r"Persistent compilation cache hit for '(?P<fn>[^']*)'")
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
WORKER_LOG = re.compile(r"^worker-(?P<k>\d+)\.log$")

MAX_ROWS = 4096  # step rows kept for tables and plots: every 2^k-th step once a log has more
MAX_DT_KEYS = 50_000  # distinct dt values before they are rounded to 4 significant digits
MAX_LINE = 1 << 20  # longer lines are cut (a binary blob in a log must not blow the memory)
MAX_SEEN = 100_000  # step lines whose arrival time a live reader keeps (`seen`)
EXPLAIN_LINES = 40


def compile_step_pattern(text: str) -> re.Pattern[str]:
    """A user's step-line regex (`scan: {step_pattern: ...}`, `--set step_pattern=...`): group `step` required,
    `dt` optional; searched anywhere in each line. Bad input is exit 2 naming the pattern."""
    from tpuops.errors import UsageError

    try:
        pattern = re.compile(text)
    except re.error as e:
        raise UsageError(
            f"step_pattern {text!r} is not a valid regular expression: {e}",
            hint=r"for example '^iter (?P<step>\d+) .*took (?P<dt>[0-9.]+)s'",
        ) from None
    if "step" not in pattern.groupindex:
        raise UsageError(
            f"step_pattern {text!r} has no named group 'step'",
            hint=r"name the step number (?P<step>\d+), and optionally its duration (?P<dt>[0-9.]+)",
        )
    return pattern


def _seconds(value: str, unit: str | None) -> float | None:
    try:
        v = float(value)
    except ValueError:
        return None
    return v / 1000 if unit == "ms" else v


@functools.lru_cache(maxsize=64)
def _day(date: str) -> int:
    """Days of an ISO date (`2026-01-20`) or absl's MMDD (`0120`, any year: gaps never span one)."""
    import datetime

    if len(date) == 4:
        return datetime.date(2000, int(date[:2]), int(date[2:])).toordinal()
    return datetime.date.fromisoformat(date).toordinal()


def _stamp(m: re.Match[str]) -> float | None:
    """Seconds of a logging prefix's timestamp (ISO date and time, or absl's MMDD time), for step gaps."""
    date, clock = m.group("date", "time")
    if date is None:
        date, clock = m.group("amd", "atime")
        if date is None:
            return None
    try:
        h, mi, sec = clock.replace(",", ".").split(":")
        return _day(date) * 86400 + int(h) * 3600 + int(mi) * 60 + float(sec)
    except ValueError:
        return None


def _duration(text: str) -> float | None:
    """A `dt` group's text: seconds, with or without `s`, or milliseconds with `ms`."""
    text = text.strip()
    if text.endswith("ms"):
        return _seconds(text[:-2], "ms")
    return _seconds(text.removesuffix("s"), "s")


def _dt_value(key: bytes | float) -> float | None:
    if isinstance(key, float):
        return key
    if key[:3] != b"dt=" or key[-1:] != b"s":
        return None
    try:
        return float(key[3:-1])
    except ValueError:
        return None


def step_row(line: str) -> tuple[StepRow, list[str]] | None:
    """A `step=` line's row and its fields in the line's order (the live view's compact row); None for any
    other line. The trainer's line (with `dt=`) and anyone's `step=N loss=... time=...` alike."""
    if not line.startswith("step="):
        return None
    data = line.encode()
    if STEP.match(data):
        return parse(data)
    m = STEP_ANY.match(line)
    if m is None:
        return None
    d = DT_ANY.search(line, m.end())
    return parse((int(m["step"]), _seconds(d["dt"], d["unit"]) if d else None, line[m.end() :]))


def config_summary(line: str) -> dict[str, str] | None:
    """The `config: key=value ...` line's fields (`steps` is the run's total); None for any other line."""
    m = CONFIG_SUMMARY.match(line)
    return kv(m["kv"]) if m else None


def json_fields(line: str) -> tuple[str, dict[str, object]] | None:
    """A `summary: {json}` or `metrics: {json}` line's kind and object; None for any other line."""
    m = JSON_LINE.match(line)
    if m is None or m["kind"] == "config":
        return None
    try:
        data = json.loads(m["json"])
    except json.JSONDecodeError:
        return None
    return (m["kind"], data) if isinstance(data, dict) else None
