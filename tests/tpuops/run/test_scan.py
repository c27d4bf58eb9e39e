"""logscan: steps and steady-state statistics, compile attribution, exit files, streaming, bounds."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tpuops.errors import UsageError
from tpuops.logs import events, scanner
from tpuops.logs.events import LogReport
from tpuops.run import scan as scanner_module
from tpuops.run.scan import LogScanner, scan_file


def step_line(i: int, dt: float, reward: float = 0.5, loss: float = 0.1, tok: float | None = 100.0) -> str:
    """A step= line exactly as docs/contracts.md prints it."""
    line = (
        f"step={i} loss={loss:.6f} entropy={1.2345:.4f} reward_mean={reward:.4f} dt={dt:.2f}s "
        f"rollout_generate={dt * 0.6:.2f}s update={dt * 0.3:.2f}s "
        "completion_len_mean=12.3 completion_len_max=32"
    )
    return line + (f" tokens_per_s={tok:.1f}" if tok is not None else "")


def scan(lines: list[str], warmup: int = 1, worker: int = 0) -> LogReport:
    s = LogScanner(warmup=warmup, worker=worker)
    s.feed_bytes(("\n".join(lines) + "\n").encode())
    return s.close()


NEW_MISS = [
    "TRACING CACHE MISS at /repo/trainer/train.py:88:4 (run):",
    "  for train_step defined at /repo/trainer/train.py:40",
    "  all previously seen cache keys differ. For the closest previous key:",
    "  different input types:",
    "  * at batch, now i32[16,40] and before i32[16,32]",
]


def compiling(fn: str, shapes: str = "int32[16,40]") -> str:
    """jax >= 0.4.36's jax_log_compiles line."""
    return (
        f"Compiling jit({fn}) with global shapes and types (ShapedArray({shapes}),). Argument mapping: (U,)."
    )


def old_compiling(fn: str) -> str:
    """jax 0.4.1x-0.4.35, through Python logging's default format."""
    prefix = "WARNING:jax._src.interpreters.pxla:"
    return f"{prefix}Compiling {fn} for with global shapes and types [ShapedArray(f32[2])]."


NEW_COMPILE = compiling("train_step")


def test_steps_table_and_steady_state_statistics_match_numpy() -> None:
    rng = random.Random(1)
    dts = [round(rng.uniform(0.5, 3.0), 2) for _ in range(50)]
    toks = [round(rng.uniform(10, 900), 1) for _ in range(50)]
    r = scan(
        [
            step_line(i, dt, reward=i / 100, loss=1 / (i + 1), tok=t)
            for i, (dt, t) in enumerate(zip(dts, toks, strict=True))
        ],
        warmup=3,
    )
    assert r.steps == 50 and (r.first_step, r.last_step) == (0, 49) and r.row_stride == 1
    assert [row.step for row in r.rows] == list(range(50))
    assert r.rows[7].dt == dts[7] and r.rows[7].reward_mean == 0.07 and r.rows[7].loss == round(1 / 8, 6)
    assert r.rows[7].rollout_generate == round(dts[7] * 0.6, 2) and r.rows[7].tokens_per_s == toks[7]
    steady = np.array(dts[3:])
    assert r.dt is not None and r.dt.n == 47
    assert r.dt.mean == pytest.approx(steady.mean(), rel=1e-12)
    assert r.dt.p50 == pytest.approx(np.quantile(steady, 0.5), rel=1e-12)
    assert r.dt.p90 == pytest.approx(np.quantile(steady, 0.9), rel=1e-12)
    assert (r.dt.min, r.dt.max) == (steady.min(), steady.max())
    assert r.tokens_per_s_mean == pytest.approx(np.mean(toks[3:]), rel=1e-12)
    assert r.update_mean == pytest.approx(np.mean([round(d * 0.3, 2) for d in dts[3:]]), rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_quantile_of_a_counted_multiset_equals_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 30, size=int(rng.integers(1, 200))) / 10
    uniq, counts = np.unique(values, return_counts=True)
    pairs = [(float(v), int(c)) for v, c in zip(uniq, counts, strict=True)]
    for q in (0.0, 0.1, 0.5, 0.9, 1.0):
        assert events.quantile(pairs, len(values), q) == pytest.approx(np.quantile(values, q), rel=1e-12)


def test_compiles_are_attributed_to_step_windows_and_recompiles_explained() -> None:
    lines = [
        "TRACING CACHE MISS at /repo/trainer/train.py:88:4 (run):",
        "  never seen function:",
        "    train_step id=140549556200096 defined at /repo/trainer/train.py:40",
        compiling("train_step", "int32[16,32]"),
        step_line(0, 9.0),
        step_line(1, 1.0),
        *NEW_MISS,
        NEW_COMPILE,
        compiling("broadcast_in_dim", "float32[]"),
        step_line(2, 3.0),
        "eval_begin step=2",
        compiling("eval_step"),
        "eval step=2 accuracy=0.4500 n=1319 dt=12.30s",
        "eval_end step=2",
        step_line(3, 1.0),
        compiling("save"),  # after the last step
    ]
    r = scan(lines)
    assert r.compiles == {"total": 5, "warmup": 1, "eval": 1, "after_warmup": 2, "open": 1}
    assert r.compiles_by_step == {0: 1, 2: 2}
    assert [(c.step, c.function) for c in r.recompiles] == [(2, "train_step"), (2, "broadcast_in_dim")]
    assert r.recompiles[0].explanation == "\n".join(NEW_MISS)
    assert r.recompiles[0].line == 12 and r.recompiles[1].explanation is None
    assert r.recompiled
    assert r.evals == [{"step": 2, "accuracy": 0.45, "n": 1319, "dt": 12.3}]


def test_warmup_is_configurable() -> None:
    lines = [NEW_COMPILE, step_line(0, 5.0), NEW_COMPILE, step_line(1, 2.0), NEW_COMPILE, step_line(2, 1.0)]
    assert [c.step for c in scan(lines, warmup=0).recompiles] == [0, 1, 2]
    assert [c.step for c in scan(lines, warmup=2).recompiles] == [2]
    r3 = scan(lines, warmup=3)
    assert not r3.recompiled and r3.compiles["warmup"] == 3 and r3.dt is None


def test_older_jax_compile_and_cache_miss_formats() -> None:
    lines = [
        old_compiling("train_step"),
        step_line(0, 2.0),
        "W1122 16:52:21.1 140 pjit.py:1] TRACING CACHE MISS at /repo/train.py:88 (run) because:",
        "  for train_step defined at /repo/train.py:40",
        "  never seen input type signature:",
        old_compiling("train_step"),
        "Compiling prim_fun (140233) for args (ShapedArray(float32[]),).",
        "Compiling module jit_train_step with FDO profile of length 12",
        step_line(1, 2.0),
    ]
    r = scan(lines)
    assert [c.function for c in r.recompiles] == ["train_step", "prim_fun"]
    assert (
        r.recompiles[0].explanation is not None
        and "never seen input type signature" in r.recompiles[0].explanation
    )
    assert r.compiles["total"] == 3


def _run_dir(tmp_path: Path, exits: dict[int, str | None], process_count: int = 2) -> Path:
    for k, code in exits.items():
        lines = [f"start: backend=cpu process_count={process_count} process_index={k}"]
        lines += [step_line(i, 1.0) for i in range(3)] if k == 0 else []
        (tmp_path / f"worker-{k}.log").write_text("\n".join(lines) + "\n")
        if code is not None:
            (tmp_path / f"worker-{k}.exit").write_text(code)
    return tmp_path


def test_exit_files_give_the_exit_code_per_worker(tmp_path: Path) -> None:
    r = scanner_module.scan_run(_run_dir(tmp_path, {0: "0\n", 1: "3\n", 2: None}, process_count=3))
    assert r.workers == [0, 1, 2] and r.steps == 3
    assert r.exit_codes == {0: 0, 1: 3, 2: None}
    assert [(f.kind, f.worker) for f in r.failures] == [("exit_code", 1), ("no_exit_file", 2)]
    unchecked = scanner_module.scan_run(
        tmp_path, check_exit=False
    )  # e.g. a live run's copy: no exit files yet
    assert unchecked.exit_codes == {} and not unchecked.failures


def test_processes_that_did_not_join_one_job(tmp_path: Path) -> None:
    r = scanner_module.scan_run(_run_dir(tmp_path, {0: "0", 1: "0"}, process_count=1))
    assert [(f.kind, f.message) for f in r.failures] == [
        ("multihost", "process_count=1 but 2 workers ran: the processes did not join one job")
    ]
    assert not scanner_module.scan_run(_run_dir(tmp_path, {0: "0", 1: "0"}, process_count=2)).failures


def test_scan_target_finds_a_run_id_under_the_state_home(tpuops_home: Path) -> None:
    run = tpuops_home / "runs" / "r1"
    run.mkdir(parents=True)
    _run_dir(run, {0: "0"}, process_count=1)
    assert scanner_module.scan_target("r1").source == str(run)
    assert scanner_module.scan_target(str(run / "worker-0.log")).exit_codes == {0: 0}
    with pytest.raises(UsageError, match="neither a log file nor a run"):
        scanner_module.scan_target("nope")


def _log(n: int, seed: int = 0) -> tuple[str, list[float]]:
    rng = random.Random(seed)
    dts = [round(rng.uniform(0.5, 4.0), 2) for _ in range(n)]
    lines = [step_line(i, dt, tok=rng.uniform(1, 1e4)) for i, dt in enumerate(dts)]
    for i in range(0, n, 97):  # noise, compiles and evals sprinkled in
        lines[i] += f"\nI1122 some library warning {i}\n{NEW_COMPILE}\neval_begin step={i}\neval_end step={i}"
    return "\n".join(lines) + "\n", dts


def test_streaming_in_any_chunking_and_line_by_line_give_the_same_report(tmp_path: Path) -> None:
    text, _ = _log(3000)
    whole = scan(text.splitlines(), warmup=2).to_dict()
    rng = random.Random(3)
    data, chunked = text.encode(), LogScanner(warmup=2)
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 5000)
        chunked.feed_bytes(data[pos : pos + step])
        pos += step
    by_line = LogScanner(warmup=2)
    for line in text.splitlines(keepends=True):
        by_line.feed(line)
    (tmp_path / "x.log").write_text(text)
    from_file = scan_file(tmp_path / "x.log", 2).to_dict()
    from_file["source"] = ""
    assert chunked.close().to_dict() == whole == by_line.close().to_dict() == from_file
    assert whole["compiles"]["after_warmup"] == 3000 // 97 + 1 - 1  # the one before step 0 is warm-up


def test_memory_is_bounded_rows_decimate_and_stats_stay_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scanner, "MAX_ROWS", 256)
    text, dts = _log(5000, seed=4)
    r = scan(text.splitlines(), warmup=1)
    assert r.row_stride == 32 and len(r.rows) <= 256 + 1
    assert [x.step for x in r.rows[:-1]] == list(range(0, 5000, 32)) and r.rows[-1].step == 4999
    steady = np.array(dts[1:])
    assert r.dt is not None and r.dt.n == 4999
    assert r.dt.p90 == pytest.approx(np.quantile(steady, 0.9), rel=1e-12)
    assert r.dt.mean == pytest.approx(steady.mean(), rel=1e-12)


def test_too_many_distinct_dt_values_are_rounded_to_four_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scanner, "MAX_DT_KEYS", 50)
    dts = [100 + i * 0.01 for i in range(400)]  # 5 significant digits each: coarsening rounds them
    s = LogScanner(warmup=0)
    for i, dt in enumerate(dts):
        s.feed(step_line(i, dt))
    r = s.close()
    assert len(s._dt) <= 50 and r.dt is not None and r.dt.n == 400
    rounded = np.array([float(f"{float(f'{d:.2f}'):.4g}") for d in dts])
    assert r.dt.p50 == pytest.approx(np.quantile(rounded, 0.5), rel=1e-12)


def test_malformed_step_lines_are_counted_not_fatal() -> None:
    # `step=1 loss=nan` is a step without a duration (someone's own format), `step=x` no step at all.
    r = scan([step_line(0, 1.0), "step=1 loss=nan", "step=x", step_line(2, 2.0), step_line(3, 3.0)])
    assert r.malformed_steps == 1 and r.steps == 4 and r.dt is not None and r.dt.n == 2
    assert [row.step for row in r.rows] == [0, 1, 2, 3] and r.rows[1].dt is None


def test_a_live_report_is_a_snapshot_and_the_open_window_closes_later() -> None:
    s = LogScanner(warmup=1)
    for line in [step_line(0, 3.0), step_line(1, 1.0), NEW_COMPILE]:
        s.feed(line)
    mid = s.report()
    assert mid.compiles["open"] == 1 and not mid.recompiled
    s.feed(step_line(2, 1.0))
    assert s.report().recompiles[0].step == 2 and mid.recompiles == []
    s.feed_bytes(step_line(3, 1.0).encode())  # no newline yet: waits for close()
    assert s.report().steps == 3 and s.close().steps == 4


REAL_JAX = """
import jax, jax.numpy as jnp
jax.config.update("jax_log_compiles", True)
jax.config.update("jax_explain_cache_misses", True)

@jax.jit
def train_step(x):
    return (x * 2).sum()

x2, x3 = jnp.ones((2,)), jnp.ones((3,))
for i, x in enumerate([x2, x2, x3, x3]):
    train_step(x).block_until_ready()
    print(f"step={i} loss=0.100000 entropy=1.0000 reward_mean=0.5000 dt=0.10s", flush=True)
print("eval_begin step=3", flush=True)
jax.jit(lambda y: y + 1)(x3).block_until_ready()
print("eval_end step=3", flush=True)
"""


def test_real_jax_compile_logging_is_attributed_to_the_step_that_recompiled(tmp_path: Path) -> None:
    """The installed jax writes the compile and cache-miss lines: logscan reads them as JAX prints them."""
    log = tmp_path / "jax.log"
    with log.open("w") as f:
        subprocess.run(
            [sys.executable, "-u", "-c", REAL_JAX],
            stdout=f,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=120,
        )
    r = scan_file(log)
    assert r.steps == 4 and not r.failures
    assert [(c.step, c.function) for c in r.recompiles] == [(2, "train_step")]
    assert r.recompiles[0].explanation is not None
    assert "at x, now f32[3] and before f32[2]" in r.recompiles[0].explanation
    assert r.compiles["eval"] == 1 and r.compiles["warmup"] >= 1 and r.compiles["open"] == 0
