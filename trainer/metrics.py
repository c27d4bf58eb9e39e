"""The single emitter of the log lines tpuops parses (docs/contracts.md); W&B logging beside them."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

# The fixed head of a step line: three fields, then `dt` (tpuops/logs/scanner.py reads dt as the fifth field),
# chosen to say whether the run learns (docs/trainer.md "The step line"); then the other learning signals,
# the time breakdown, `loss` (about 0 by construction in GRPO: no progress signal) and everything else.
HEAD = (("reward_mean", ".4f"), ("reward_delta", "+.4f"), ("entropy", ".4f"))
SIGNALS = (
    ("kl", ".6f"),
    ("kl_old", ".6f"),
    ("clip_frac", ".4f"),
    ("grad_norm", ".4f"),
    ("tokens_per_s", ".1f"),
)
OPTIONAL = ("kl", "kl_old")  # printed only when given (the KL to the reference needs loss.beta > 0)
TIMES = ("rollout_generate", "update")
EXTRA_TIMES = ("reward_score",)  # further phases, seconds
TAIL_HEAD = (("loss", ".6f"),)
# Per-chip figures of this process's local chips (trainer/chips.py), after the rest, when the backend exposes them
# (TPU, GPU; never on CPU): HBM in use min/max and peak in GB, the smallest chip's HBM, duty cycle min/max in
# percent, and each chip's HBM and duty cycle joined by `/`. Processes other than 0 print them on `chips:` lines.
CHIPS = (("hbm_gb_min", ".2f"), ("hbm_gb_max", ".2f"), ("hbm_gb_peak", ".2f"), ("hbm_gb_limit", ".2f"),
         ("duty_pct_min", ".1f"), ("duty_pct_max", ".1f"))  # fmt: skip
CHIP_LISTS = ("hbm_gb_chips", "duty_pct_chips")
WARMUP_STEPS = 1  # the first step line(s) of a log, which compile: tpuops' default --warmup
CONFIG_FILE = "config.json"  # the resolved config in full, in the run directory (TPUOPS_RUN_DIR) tpuops gives


def printed_dt(dt: float) -> float:
    """`dt` as a step line prints it (2 decimals): what tpuops reads back."""
    return float(f"{dt:.2f}")


def steady_dt_p50(dts: Sequence[float], warmup: int = WARMUP_STEPS) -> float | None:
    """The steady step time p50 (docs/contracts.md), defined as tpuops' report defines it: numpy's median with
    linear interpolation of the printed `dt` of every step line of this log but the first `warmup`; None when
    there is no such step. (Computed as tpuops/run/scan.py's `quantile` does, so the two agree to the bit.)"""
    xs = sorted(printed_dt(d) for d in dts[warmup:])
    if not xs:
        return None
    h = (len(xs) - 1) * 0.5
    lo = int(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (h - lo)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e7 else f"{value:.6g}"
    return str(value).replace(" ", "_")


def format_step(step: int, values: Mapping[str, Any]) -> str:
    """`step={i} reward_mean={:.4f} reward_delta={:+.4f} entropy={:.4f} dt={:.2f}s [kl={:.6f}] [kl_old={:.6f}]
    clip_frac={:.4f} grad_norm={:.4f} tokens_per_s={:.1f} rollout_generate=..s update=..s [reward_score=..s]
    loss={:.6f} ...` (the rest in the order given)."""
    v = dict(values)
    parts = [f"step={step}"]
    parts += [f"{key}={float(v.pop(key, 0.0)):{spec}}" for key, spec in HEAD]
    parts.append(f"dt={float(v.pop('dt', 0.0)):.2f}s")  # printed_dt's precision
    parts += [
        f"{key}={float(v.pop(key, 0.0)):{spec}}" for key, spec in SIGNALS if key in v or key not in OPTIONAL
    ]
    parts += [f"{key}={float(v.pop(key, 0.0)):.2f}s" for key in TIMES]
    parts += [f"{key}={float(v.pop(key)):.2f}s" for key in EXTRA_TIMES if key in v]
    parts += [f"{key}={float(v.pop(key, 0.0)):{spec}}" for key, spec in TAIL_HEAD]
    chips = format_chips(v)
    parts += [f"{k}={_fmt(x)}" for k, x in v.items()]
    return " ".join([*parts, chips] if chips else parts)


def format_chips(values: dict[str, Any]) -> str:
    """The chip fields present in `values` (removed from it), in CHIPS order: '' when there are none (CPU)."""
    parts = [f"{key}={float(values.pop(key)):{spec}}" for key, spec in CHIPS if key in values]
    parts += [f"{key}={values.pop(key)}" for key in CHIP_LISTS if key in values]
    return " ".join(parts)


def format_fields(prefix: str, values: Mapping[str, Any]) -> str:
    return " ".join([prefix, *(f"{k}={_fmt(v)}" for k, v in values.items())])


class Emitter:
    """Prints the contract's lines (process 0 only for per-step lines) and mirrors metrics to W&B."""

    def __init__(self, process_index: int = 0, out: TextIO | None = None) -> None:
        self.is_main = process_index == 0
        self.out = out or sys.stdout
        self.wandb: Any = None

    def line(self, text: str, *, all_processes: bool = False) -> None:
        if self.is_main or all_processes:
            print(text, file=self.out, flush=True)

    def start(self, **fields: Any) -> None:
        self.line(format_fields("start:", fields), all_processes=True)

    def config(self, summary: Mapping[str, Any], cfg_json: str, run_dir: str | None = None) -> None:
        """`config: key=value ...`: the few settings that say what runs (one short line); the full JSON goes
        to `<run_dir>/config.json` (written atomically by process 0; `file=` names it) when a run directory is
        given (tpuops sets TPUOPS_RUN_DIR), and `python -m trainer.main --print-config` prints it anyway."""
        fields = dict(summary)
        if run_dir and self.is_main:
            path = Path(run_dir).expanduser() / CONFIG_FILE
            tmp = path.with_name(f".{CONFIG_FILE}.{os.getpid()}")
            tmp.write_text(cfg_json + "\n")
            tmp.replace(path)
            fields["file"] = str(path)
        self.line(format_fields("config:", fields))

    def batch(self, fields: Mapping[str, Any]) -> None:
        self.line(format_fields("batch:", fields))

    def step(self, step: int, values: Mapping[str, Any]) -> None:
        self.line(format_step(step, values))
        if self.wandb is not None and self.is_main:
            self.wandb.log({f"train/{k}": v for k, v in values.items() if not isinstance(v, str)}, step=step)

    def chips(self, step: int, process: int, values: Mapping[str, Any]) -> None:
        """`chips: step=N process=P hbm_gb_min=...`: a process other than 0's own chips (process 0's are on its
        step line); nothing when the backend exposes none."""
        text = format_chips(dict(values))
        if text and not self.is_main:
            self.line(f"chips: step={step} process={process} {text}", all_processes=True)

    def eval_begin(self, step: int) -> None:
        self.line(f"eval_begin step={step}")

    def eval_result(self, step: int, accuracy: float, n: int, dt: float) -> None:
        self.line(f"eval step={step} accuracy={accuracy:.4f} n={n} dt={dt:.2f}s")
        if self.wandb is not None and self.is_main:
            self.wandb.log({"eval/accuracy": accuracy}, step=step)

    def eval_end(self, step: int) -> None:
        self.line(f"eval_end step={step}")

    def checkpoint(self, step: int, path: str) -> None:
        self.line(f"checkpoint step={step} path={path}")

    def reward_errors(self, step: int, name: str, count: int) -> None:
        self.line(f"reward_errors step={step} name={name} count={count}")

    def summary(self, data: Mapping[str, Any]) -> None:
        self.line("summary: " + json.dumps(dict(data), separators=(",", ":"), default=float))

    def metrics(self, data: Mapping[str, Any]) -> None:
        self.line("metrics: " + json.dumps(dict(data), separators=(",", ":"), default=float))
