"""The log-line contract (docs/contracts.md): trainer/metrics.py formats, tpuops/logscan.py parses."""

from __future__ import annotations

import random
import re

import pytest

from tpuops.run.scan import LogScanner

metrics = pytest.importorskip(
    "trainer.metrics", reason="trainer/metrics.py (the log-line emitter) has not landed"
)

FIXED = re.compile(
    r"^step=\d+ reward_mean=-?\d+\.\d{4} reward_delta=[+-]\d+\.\d{4} entropy=-?\d+\.\d{4} dt=\d+\.\d{2}s "
    r"clip_frac=\d+\.\d{4} grad_norm=\d+\.\d{4} tokens_per_s=\d+\.\d "
    r"rollout_generate=\d+\.\d{2}s update=\d+\.\d{2}s loss=-?\d+\.\d{6} "
)


def values(rng: random.Random) -> dict[str, float | int]:
    dt = rng.uniform(0.2, 5.0)
    return {
        "loss": rng.uniform(-1, 1),
        "reward_delta": rng.uniform(-1, 1),
        "clip_frac": rng.uniform(0, 0.5),
        "entropy": rng.uniform(0, 3),
        "reward_mean": rng.uniform(-1, 1),
        "dt": dt,
        "rollout_generate": dt * 0.7,
        "update": dt * 0.2,
        "completion_len_mean": rng.uniform(5, 300),
        "completion_len_max": rng.randint(5, 512),
        "tokens_per_s": rng.uniform(10, 5000),
        "grad_norm": rng.uniform(0, 10),
        "reward_number": rng.uniform(0, 1),  # a key logscan does not know: it must be accepted
    }


def test_step_lines_round_trip_through_the_parser() -> None:
    rng = random.Random(0)
    vals = [values(rng) for _ in range(40)]
    lines = [metrics.format_step(i, v) for i, v in enumerate(vals)]
    for line in lines:
        assert FIXED.match(line), line  # the first fields, their order and formats are the contract
        assert "\n" not in line
    scanner = LogScanner(warmup=2)
    for line in lines:
        scanner.feed(line)
    report = scanner.close()
    assert report.steps == 40 and report.malformed_steps == 0 and not report.failures
    for i, (row, v) in enumerate(zip(report.rows, vals, strict=True)):
        assert row.step == i
        assert row.loss == float(f"{v['loss']:.6f}")
        assert row.reward_mean == float(f"{v['reward_mean']:.4f}")
        assert row.dt == float(f"{v['dt']:.2f}")
        assert row.rollout_generate == float(f"{v['rollout_generate']:.2f}")
        assert row.update == float(f"{v['update']:.2f}")
        assert row.tokens_per_s == float(f"{v['tokens_per_s']:.1f}")
    steady = sorted(float(f"{v['dt']:.2f}") for v in vals[2:])
    assert report.dt is not None and report.dt.n == 38
    assert (report.dt.min, report.dt.max) == (steady[0], steady[-1])
    assert report.dt.mean == pytest.approx(sum(steady) / 38, rel=1e-12)
