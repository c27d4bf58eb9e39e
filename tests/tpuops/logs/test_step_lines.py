"""Step lines as people write them: every form and logging prefix the scanner knows, durations, the user's own
step_pattern, and the recompile rule on each (compiles after the warm-up, between step lines)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from tpuops.errors import UsageError
from tpuops.logs.events import LogReport
from tpuops.logs.scanner import LogScanner

# JAX's compile logging as it reaches a log: through Python's logging (lastResort: bare), with a prefix, absl.
COMPILE = "Compiling jit(step_fn) with global shapes and types (ShapedArray(float32[4,8]),). Argument mapping: (U,)."
COMPILE_LOGGED = f"WARNING:jax._src.interpreters.pxla:{COMPILE}"
RECOMPILE = COMPILE.replace("[4,8]", "[4,9]")

# The step-line forms (docs/logs.md "Step lines"), each with a duration the form's users print.
FORMS = {
    "step=": "step={i} loss=0.25 step_time={dt}s",
    "step:": "step: {i} | loss: 0.25 | dt: {dt}",
    "Step N/M": "Step {i}/100 - loss 0.25 - elapsed {dt}s",
    "[step N]": "[step {i}] loss=0.25 time={ms}ms",
}
PREFIXES = {
    "bare": "",
    "INFO:root:": "INFO:root:",
    "asctime": "2026-01-20 12:00:{s:02d},123 INFO ",
    "asctime - name - level -": "2026-01-20 12:00:{s:02d},123 - __main__ - INFO - ",
    "absl": "I0120 12:00:{s:02d}.123456 140321 train.py:88] ",
}


def scan(lines: list[str], warmup: int = 1, **kw: object) -> LogReport:
    s = LogScanner(warmup=warmup, **kw)  # type: ignore[arg-type]
    s.feed_bytes(("\n".join(lines) + "\n").encode())
    return s.close()


def run_lines(form: str, prefix: str, recompile_at: int | None, steps: int = 5) -> list[str]:
    """A short run: the warm-up compile before step 0's line, optionally a recompile before step k's."""
    lines = [COMPILE_LOGGED]
    for i in range(steps):
        if i == recompile_at:
            lines.append(RECOMPILE)
        lines.append(prefix.format(s=2 * i) + form.format(i=i, dt=1.5, ms=1500))
    return lines


@pytest.mark.parametrize(("form", "prefix"), list(itertools.product(FORMS, PREFIXES)))
def test_every_form_and_prefix_counts_steps_and_catches_a_recompile(form: str, prefix: str) -> None:
    clean = scan(run_lines(FORMS[form], PREFIXES[prefix], None))
    assert (clean.steps, clean.first_step, clean.last_step, clean.malformed_steps) == (5, 0, 4, 0)
    assert clean.compiles["warmup"] == 1 and not clean.recompiled
    assert clean.dt is not None and clean.dt.n == 4 and clean.dt.p50 == 1.5  # the printed duration
    assert [row.loss for row in clean.rows] == [0.25] * 5
    dirty = scan(run_lines(FORMS[form], PREFIXES[prefix], 2))
    assert dirty.recompiled and dirty.compiles["after_warmup"] == 1
    assert [(c.step, c.function) for c in dirty.recompiles] == [(2, "step_fn")]


@pytest.mark.parametrize(
    ("line", "dt"),
    [
        ("step=3 dt=1.25s", 1.25),
        ("step=3 step_time=1.37", 1.37),
        ("step: 3 time: 370ms", 0.37),
        ("Step 3/9 step_s=2", 2.0),
        ("[step 3] elapsed 4.5 s", 4.5),
        ("step=3 wall_time=9.0 loss=1", None),  # not a duration key: no dt
    ],
)
def test_a_duration_under_any_of_its_names(line: str, dt: float | None) -> None:
    (row,) = scan([line], warmup=0).rows
    assert row.step == 3 and row.dt == dt


def test_without_a_duration_the_gap_between_step_lines_is_the_step_time() -> None:
    stamped = scan([f"2026-01-20 12:00:{s:02d},500 INFO step {i}" for i, s in enumerate([0, 3, 5, 9])])
    assert [r.dt for r in stamped.rows] == [None, 3.0, 2.0, 4.0]
    assert stamped.dt is not None and stamped.dt.p50 == 3.0
    absl = scan([f"I0131 23:59:5{i}.000000 1 t.py:1] step={i}" for i in range(3)])  # across midnight too
    assert [r.dt for r in absl.rows] == [None, 1.0, 1.0]
    followed = scan(
        ["step: 0", "step: 1", "step: 2", "step: 3"], seen={0: 100.0, 1: 101.5, 2: 101.5, 3: 104.0}
    )
    assert [r.dt for r in followed.rows] == [None, 1.5, None, 2.5]  # 2 came in the same poll as 1: unknown
    ticks = iter([10.0, 10.5, 12.0])  # a live reader's clock: when it saw each line
    seen = scan(["step: 0", "step: 1", "step: 2"], clock=lambda: next(ticks))
    assert [r.dt for r in seen.rows] == [None, 0.5, 1.5]


def test_the_trainers_other_records_are_not_steps() -> None:
    r = scan(
        [
            "eval_begin step=10",
            "eval step=10 accuracy=0.4500 n=1319 dt=12.30s",
            "eval_end step=10",
            "checkpoint step=10 path=/ckpt/10",
            "reward_errors step=3 name=correctness count=2",
            "stopped: SIGTERM (preemption notice or tpuops stop) after step=8; checkpoint saved",
            "INFO:root:evaluating at step 4",
            "the first step 1 of the schedule",
            COMPILE,
        ]
    )
    assert r.steps == 0 and r.checkpoints == 1 and len(r.evals) == 1


def test_the_bundled_trainers_lines_parse_exactly_as_before() -> None:
    line = (
        "step={i} reward_mean=0.5000 reward_delta=+0.0000 entropy=1.2345 dt={dt:.2f}s clip_frac=0.0000 "
        "grad_norm=0.1234 tokens_per_s=123.4 rollout_generate=0.80s update=0.40s loss=0.000000"
    )
    r = scan([line.format(i=i, dt=1 + i / 10) for i in range(6)])
    assert r.steps == 6 and r.malformed_steps == 0 and r.dt is not None and r.dt.n == 5
    assert r.dt.p50 == pytest.approx(1.3) and r.rows[2].update == 0.4 and r.rows[2].tokens_per_s == 123.4


def test_a_step_pattern_replaces_the_forms_and_reads_its_dt_group() -> None:
    lines = [
        "iter 0 took 5.0s",
        COMPILE,
        "iter 1 took 250ms",
        "step=7 dt=1.00s",
        RECOMPILE,
        "iter 2 took 0.5",
    ]
    r = scan(lines, step_pattern=r"^iter (?P<step>\d+) took (?P<dt>\S+)")
    assert [(row.step, row.dt) for row in r.rows] == [(0, 5.0), (1, 0.25), (2, 0.5)]  # step=7 is not theirs
    assert r.recompiled and [c.step for c in r.recompiles] == [1, 2]


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("iter (?P<step>\\d+", "is not a valid regular expression"),
        ("iter (\\d+)", "has no named group 'step'"),
    ],
)
def test_a_bad_step_pattern_is_bad_input_naming_it(pattern: str, says: str) -> None:
    with pytest.raises(UsageError) as e:
        LogScanner(step_pattern=pattern)
    assert e.value.message.startswith(f"step_pattern {pattern!r} {says}")


def test_report_reads_a_users_log_with_their_pattern_and_refuses_a_bad_one(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(
        "\n".join(["INFO:root:Step 0/3 loss 1.0", COMPILE, "iter 1 took 2s", RECOMPILE, "iter 2 took 2s"])
    )

    def report(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tpuops", "report", str(log), *args],
            capture_output=True,
            text=True,
            check=False,
        )

    default = report()
    assert default.returncode == 0 and "1 steps (0..0)" in default.stderr  # `iter` lines are not a known form
    mine = report("--step-pattern", r"^(?:iter|INFO:root:Step) (?P<step>\d+)")
    assert mine.returncode == 7, mine.stderr
    bad = report("--step-pattern", "(?P<step>")
    assert bad.returncode == 2 and "step_pattern '(?P<step>' is not a valid regular expression" in bad.stderr
