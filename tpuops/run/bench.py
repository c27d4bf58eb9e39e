"""`tpuops bench rollout`: the same run (GRPO, or any SOP such as your own command) under several variants, step
and rollout times side by side."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tpuops.errors import UsageError
from tpuops.run import finish, launch
from tpuops.run.finish import Verdict
from tpuops.run.result import RunResult
from tpuops.sop.executor import StepReport
from tpuops.transport.base import LineSink


@dataclass(frozen=True)
class VariantResult:
    label: str
    run_id: str
    ok: bool
    steps: int
    dt_p50: float | None
    dt_mean: float | None
    rollout_generate_mean: float | None
    update_mean: float | None
    # --profile: the first traced worker's top ops over the traced steps (name, ms, share), its phase split,
    # or why there is no trace
    top_ops: list[dict[str, object]] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    profile_note: str | None = None


@dataclass(frozen=True)
class Bench:
    """A bench's end: a row per variant that ran (the table and its JSON), and the one verdict of them all."""

    variants: list[VariantResult]
    verdict: Verdict

    @property
    def code(self) -> int:
        return int(self.verdict.code)


PROFILE_STEPS = "2-3"  # `--profile`'s steps unless --set profile_steps=A-B: past the warm-up and its compiles
TOP_OPS = 5


def with_profile(req: launch.RunRequest) -> launch.RunRequest:
    """`--profile`: every variant traces the same steps (its `--set profile_steps`, else PROFILE_STEPS)."""
    return replace(req, sets={"profile_steps": PROFILE_STEPS, **req.sets})


def parse_variant(text: str) -> dict[str, str]:
    """`a.b=1,c.d=x` (or empty for the baseline) -> {"a.b": "1", "c.d": "x"}."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise UsageError(
                f"--variant {text!r}: expected key=value[,key=value]",
                hint="e.g. --variant rollout.temperature=0.7",
            )
        out[key] = value
    return out


ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def command_variant(text: str) -> tuple[list[str], list[str]]:
    """A variant of the user's command, as a shell reads a command line: leading `NAME=value` words are its
    environment, the rest are arguments appended to the command. `XLA_FLAGS=--x --set batch=8` ->
    (["XLA_FLAGS=--x"], ["--set", "batch=8"])."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"--variant {text!r}: {e}", hint="quote it as you would on a shell line") from None
    env = []
    while words and ENV_WORD.match(words[0]):
        env.append(words.pop(0))
    return env, words


def variant_request(req: launch.RunRequest, text: str) -> launch.RunRequest:
    """The request of one variant: with a command (`-- CMD`), environment and extra arguments; otherwise
    `--set` values (trainer overrides `a.b=v`, or SOP parameters)."""
    if not req.command:
        return replace(req, sets={**req.sets, **parse_variant(text)})
    env, args = command_variant(text)
    sets = dict(req.sets)
    if env:
        sets["env"] = shlex.join([*shlex.split(sets.get("env", "")), *env])
    return replace(req, sets=sets, command=(*req.command, *args))


def plans(req: launch.RunRequest, variants: list[str]) -> list[tuple[str, RunResult]]:
    """Every variant validated (SOP values, the trainer's own overrides) and planned (dry runs, each with its
    `planned`); nothing runs remotely."""
    out = []
    target = None  # resolved by the first plan, after its values were checked; reused by the others
    for text in variants or [""]:
        dry = launch.start(replace(variant_request(req, text), dry_run=True), target=target)
        assert dry.planned is not None  # a dry run
        out.append((text or "baseline", dry))
        target = dry.planned.target
    return out


def run(
    req: launch.RunRequest,
    variants: list[str],
    *,
    on_line: LineSink | None = None,
    on_step: Callable[[StepReport], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    notify: Callable[[str], None] | None = None,
    on_phase: Callable[[int, str, str, str], None] | None = None,
) -> Bench:
    """Run every variant one after another on the same target; the first is the baseline of the ratios.

    Every variant is validated before the first one starts: a typo in the last one costs no run. Each one
    runs through `launch.start`, so on a VM it is watched like any SOP: a lost VM ends the bench (exit 8, the
    variants after it do not run). The bench's exit code is its verdict (`finish.judge_runs`): the first variant
    that is not ok gives its own (an out-of-memory 10, a hang 9, ...); one that read no log is failed (1)."""
    variants = variants or [""]
    first = plans(req, variants)[0][1].planned
    assert first is not None
    target = first.target  # the target resolved once for every variant
    runs: list[RunResult] = []
    rows: list[VariantResult] = []
    for text in variants:
        result = launch.start(
            variant_request(req, text),
            on_line=on_line,
            on_step=on_step,
            on_phase=on_phase,
            on_notice=on_notice,
            notify=notify,
            target=target,
        )
        runs.append(result)
        rows.append(_result(text or "baseline", result))
        if result.vm_lost is not None:  # the VM is gone: the next variant has nowhere to run
            break
    return Bench(rows, finish.judge_runs(runs, need_log=True))


def _result(label: str, result: RunResult) -> VariantResult:
    report, log = result.report, result.log
    dt = log.dt if log is not None else None
    row = VariantResult(
        label=label,
        run_id=report.run_id,
        ok=report.ok and log is not None and not log.failed,
        steps=log.steps if log is not None else 0,
        dt_p50=dt.p50 if dt else None,
        dt_mean=dt.mean if dt else None,
        rollout_generate_mean=log.rollout_generate_mean if log is not None else None,
        update_mean=log.update_mean if log is not None else None,
    )
    return _with_profile(row, result)


def _with_profile(row: VariantResult, result: RunResult) -> VariantResult:
    """A variant's top ops and phases from its trace of the asked steps (its first worker with one)."""
    p = result.profile
    if p is None:
        return row
    if not p.traces:
        return replace(row, profile_note=next(iter(p.errors.values()), "no trace"))
    s = min(p.traces.items())[1].summary
    ops: list[dict[str, object]] = [{"name": o.name, "ms": o.ms, "share": o.share} for o in s.ops[:TOP_OPS]]
    return replace(row, top_ops=ops, phases=s.phases)
