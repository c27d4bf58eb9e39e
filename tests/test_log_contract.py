"""The log-line contract (docs/contracts.md): trainer/metrics.py formats, tpuops/logs/scanner.py parses."""

from __future__ import annotations

import io
import random
import re
from typing import Any

import numpy as np
import pytest

from tpuops.logs.scanner import LogScanner

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


def _steady_p50_both_ways(dts: list[float], start: int = 0) -> tuple[float | None, float | None, Any]:
    """(the trainer's summary dt_p50, tpuops' report dt p50, the report) for one log of these step times."""
    from trainer.loop.record import summary

    rng = random.Random(len(dts))
    history = [{**values(rng), "dt": dt} for dt in dts]
    out = io.StringIO()
    emit = metrics.Emitter(0, out)
    for i, row in enumerate(history):
        emit.step(start + i, row)
    trainer_summary = summary(history, start)
    emit.summary(trainer_summary)
    scanner = LogScanner()  # tpuops' default warm-up
    for line in out.getvalue().splitlines():
        scanner.feed(line)
    report = scanner.close()
    assert report.steps == len(dts) and report.summary is not None
    assert report.summary["dt_p50"] == trainer_summary["dt_p50"]  # the printed summary says the same
    return trainer_summary["dt_p50"], (report.dt.p50 if report.dt else None), report


def test_the_trainer_summary_and_the_tpuops_report_agree_on_the_steady_step_time_p50() -> None:
    """One definition (docs/contracts.md): numpy's linear median of the printed `dt` of every step line but
    the first. Even-length steady runs are where the trainer's old `sorted(dts[1:])[n // 2]` differed."""
    awkward = [31.7, 1.234999, 1.2351, 0.98, 2.5, 1.004, 1.006]  # 6 steady steps; two round across .xx5
    trainer_p50, tpuops_p50, report = _steady_p50_both_ways(awkward)
    printed = [float(f"{d:.2f}") for d in awkward[1:]]
    assert trainer_p50 == tpuops_p50 == pytest.approx(float(np.median(printed)), rel=1e-12)
    assert report.dt.n == 6
    old_definition = sorted(awkward[1:])[len(awkward[1:]) // 2]
    assert abs(old_definition - trainer_p50) > 0.01  # the old trainer figure: the upper middle, unrounded
    rng = random.Random(1)
    for n in (2, 3, 4, 9, 10, 41):
        dts = [rng.uniform(5, 30)] + [
            rng.choice([0.5, 1.0, 2.0]) * rng.uniform(0.9, 1.1) for _ in range(n - 1)
        ]
        trainer_p50, tpuops_p50, _ = _steady_p50_both_ways(dts, start=rng.choice([0, 5]))  # a resume too
        assert trainer_p50 == tpuops_p50, (n, dts)
    # One step: no steady step, so neither has a p50 (the trainer used to report the compile step's time).
    assert _steady_p50_both_ways([12.0])[:2] == (None, None)


def test_the_config_line_is_a_short_summary_and_the_full_config_is_a_file(tmp_path: Any) -> None:
    """`config: key=value ...` (one short line, what the live view and the scanner read) and the full JSON in
    the run directory; older logs' `config: {json}` still parse."""
    import json

    from trainer import config, startup

    cfg = config.load("arith")
    buf = io.StringIO()
    metrics.Emitter(out=buf).config(startup.summary(cfg), config.dumps(cfg), run_dir=str(tmp_path))
    line = buf.getvalue().rstrip("\n")
    assert "\n" not in line and len(line) < 300, line
    assert json.loads((tmp_path / "config.json").read_text()) == json.loads(config.dumps(cfg))
    s = LogScanner()
    s.feed(line)
    summary = s.close().config_summary
    assert summary["steps"] == str(cfg.train.steps) and summary["task"] == "arith"
    assert summary["learning_rate"] == "0.02" and summary["file"] == str(tmp_path / "config.json")
    assert summary["max_reward"] == "1"  # arith: 0.9 for a bare number + 0.1 for the right sum
    other = io.StringIO()  # a process other than 0, or no run directory: no file, no `file=`
    metrics.Emitter(process_index=0, out=other).config(startup.summary(cfg), config.dumps(cfg))
    assert "file=" not in other.getvalue()
    old = LogScanner()
    old.feed('config: {"train": {"steps": 3}}')
    assert old.close().config == {"train": {"steps": 3}}


def test_the_trainer_starts_jax_on_the_cpu_where_there_is_no_accelerator(tmp_path: Any) -> None:
    """No TPU or GPU device: jax_platforms=cpu, so libtpu (the `tpu` extra) never prints its start-up errors;
    a TPU device, the config's mesh.platforms or the user's JAX_PLATFORMS: as given."""
    from trainer import config, startup

    cfg = config.load("arith")
    dev = tmp_path / "dev"
    dev.mkdir()
    assert startup.platforms(cfg, env={}, dev=dev) == "cpu"
    assert startup.platforms(cfg, env={"JAX_PLATFORMS": "tpu"}, dev=dev) is None  # JAX read it already
    (dev / "vfio").mkdir()
    (dev / "vfio" / "vfio").touch()  # the control file alone is no TPU
    assert startup.platforms(cfg, env={}, dev=dev) == "cpu"
    (dev / "vfio" / "0").touch()
    assert startup.platforms(cfg, env={}, dev=dev) is None
    (dev / "vfio" / "0").unlink()
    (dev / "accel0").touch()
    assert startup.platforms(cfg, env={}, dev=dev) is None
    pinned = config.load("arith", ["mesh.platforms=cpu"])
    assert startup.platforms(pinned, env={}, dev=dev) == "cpu"


def test_chip_fields_round_trip_and_lines_without_them_parse_as_before() -> None:
    """Per-chip HBM and duty cycle (docs/contracts.md): after the rest of process 0's step line, and on `chips:`
    lines of the other processes; a step line without them (CPU, older logs) parses exactly as before."""
    from trainer import chips

    rng = random.Random(7)
    base = values(rng)
    got = chips.fields([20.1e9, 22.4e9], [23.0e9, 23.5e9], [33.6e9, 33.6e9], [61.0, 74.5])
    assert got == {"hbm_gb_min": 20.1, "hbm_gb_max": 22.4, "hbm_gb_chips": "20.10/22.40", "hbm_gb_peak": 23.5,
                   "hbm_gb_limit": 33.6, "duty_pct_min": 61.0, "duty_pct_max": 74.5,
                   "duty_pct_chips": "61.0/74.5"}  # fmt: skip
    plain = metrics.format_step(4, base)
    line = metrics.format_step(4, {**base, **got})
    assert FIXED.match(line) and line.startswith(plain + " ")  # the chip fields come last, nothing else moves
    assert line.endswith(
        "hbm_gb_min=20.10 hbm_gb_max=22.40 hbm_gb_peak=23.50 hbm_gb_limit=33.60 duty_pct_min=61.0 duty_pct_max=74.5 "
        "hbm_gb_chips=20.10/22.40 duty_pct_chips=61.0/74.5"
    )
    out = io.StringIO()
    metrics.Emitter(process_index=1, out=out).chips(4, 1, {"hbm_gb_min": 18.0, "hbm_gb_max": 19.5,
                                                           "hbm_gb_chips": "18.00/19.50"})  # fmt: skip
    metrics.Emitter(process_index=0, out=out).chips(
        4, 0, got
    )  # process 0's are on its step line: no chips line
    metrics.Emitter(process_index=1, out=out).chips(4, 1, {})  # a CPU backend: nothing
    assert (
        out.getvalue()
        == "chips: step=4 process=1 hbm_gb_min=18.00 hbm_gb_max=19.50 hbm_gb_chips=18.00/19.50\n"
    )
    s = LogScanner()
    for text in (plain, line, out.getvalue()):
        s.feed(text)
    report = s.close()
    old, new = report.rows
    assert (old.hbm_gb_max, old.duty_pct_min, old.hbm_gb_chips) == (None, None, None)
    assert (new.hbm_gb_min, new.hbm_gb_max, new.hbm_gb_peak, new.hbm_gb_limit) == (20.1, 22.4, 23.5, 33.6)
    assert (new.duty_pct_min, new.duty_pct_max, new.duty_pct_chips, new.hbm_gb_chips) == (61.0, 74.5, [61.0, 74.5],
                                                                                           [20.1, 22.4])  # fmt: skip
    assert (old.dt, old.loss, old.reward_mean) == (new.dt, new.loss, new.reward_mean)
    assert report.chips[1] == [
        {"step": 4, "hbm_gb_min": 18.0, "hbm_gb_max": 19.5, "hbm_gb_chips": [18.0, 19.5]}
    ]
    assert [c["step"] for c in report.chips[0]] == [4] and report.hbm_peak_gb == 23.5
    bare = LogScanner()
    bare.feed(plain)
    assert bare.close().chips == {}


def test_a_cpu_backend_exposes_no_chip_fields() -> None:
    import jax

    from trainer import chips

    assert jax.local_devices()[0].platform == "cpu"
    assert chips.sample(jax.local_devices()) == {}
    assert chips.fields([], [], [], []) == {}
