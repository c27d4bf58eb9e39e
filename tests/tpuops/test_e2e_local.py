"""The README's main job end to end: `tpuops run grpo --local` runs the bundled trainer on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.data import DATA

REPO = Path(__file__).resolve().parents[2]


def tpuops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the exit code is what these tests check
        [sys.executable, "-m", "tpuops", *args],
        cwd=cwd, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "COLUMNS": "200"},
    )  # fmt: skip


@pytest.mark.slow
def test_run_grpo_locally_reports_steps() -> None:
    r = tpuops(
        "run", "grpo", "--local", "--set", "steps=3", "--set", "checkpoint.every=2", "--json", cwd=REPO
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(r.stdout)
    assert data["ok"] and data["error_class"] == "ok"
    log = data["log"]
    assert log["steps"] == 3 and log["first_step"] == 0 and log["last_step"] == 2
    assert log["start"]["backend"] == "cpu" and log["summary"]["steps"] == 3
    assert not log["failures"]
    assert "[w0] step=2 " in r.stderr  # followed live, prefixed with the worker
    # Checkpoints asked for but nowhere to write them: said at the start, not discovered at a preemption.
    assert (
        "[w0] warning: checkpoint.every=2 but checkpoint.dir is empty: no checkpoint will be written"
        in r.stderr
    )
    home = Path(os.environ["TPUOPS_HOME"])
    assert (home / "runs" / data["run_id"] / "worker-0.log").exists()


@pytest.mark.slow
def test_the_default_local_job_learns_the_arith_task() -> None:
    """The README's first command as it is: no --set, no data folder, no network. The tiny model with the
    bundled tokenizer learns the answer format of the arith task: mean reward from <= 0.3 to >= 0.8."""
    t0 = time.monotonic()
    r = tpuops("run", "grpo", "--local", "--json", cwd=REPO)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    log = json.loads(r.stdout)["log"]
    assert log["config"]["data"]["task"] == "arith" and log["config"]["model"]["tokenizer"] == "bundled"
    rewards = [row["reward_mean"] for row in log["rows"]]
    assert len(rewards) == 20 and rewards[0] <= 0.3 and rewards[-1] >= 0.8, rewards
    s = log["summary"]
    assert s["reward_mean_change"] >= 0.4 and s["reward_mean_first"] == rewards[0]  # the end report says so
    assert took < 180, f"{took:.0f}s"


def test_trainer_override_typo_is_refused_before_anything_runs() -> None:
    r = tpuops("run", "grpo", "--local", "--set", "train.stepz=3", cwd=REPO)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "error: trainer config: unknown config key 'train.stepz'; did you mean 'train.steps'?"
    )
    assert not (Path(os.environ["TPUOPS_HOME"]) / "local").exists()  # no worker was touched


def test_bench_rollout_validates_every_variant_before_the_first_runs() -> None:
    argv = ["bench", "rollout", "--local", "--set", "steps=2", "--variant", "", "--variant"]
    typo = tpuops(*argv, "rollout.max_new_tokenz=4", cwd=REPO)
    assert typo.returncode == 2
    assert typo.stderr.strip().splitlines()[-1] == (
        "error: trainer config: unknown config key 'rollout.max_new_tokenz'; did you mean 'rollout.max_new_tokens'?"
    )
    runs = Path(os.environ["TPUOPS_HOME"]) / "runs"
    assert not runs.exists(), sorted(str(p) for p in runs.rglob("*"))  # not even the baseline ran
    plans = tpuops(*argv, "rollout.max_new_tokens=4", "--dry-run", "--json", cwd=REPO)
    assert plans.returncode == 0, plans.stderr
    data = json.loads(plans.stdout)
    assert [d["variant"] for d in data] == ["baseline", "rollout.max_new_tokens=4"]
    base, variant = (d["values"]["trainer_sets"] for d in data)
    # --set steps=2 reaches the trainer as train.steps (maps_to); the variant adds only its own override.
    assert "--set=train.steps=2" in base and variant == [*base, "--set=rollout.max_new_tokens=4"]
    assert not (Path(os.environ["TPUOPS_HOME"]) / "runs").exists()


def test_gradcheck_and_microbench_commands_report_metrics() -> None:
    gc = tpuops("gradcheck", "ce", "--local", "--json", cwd=REPO)
    assert gc.returncode == 0, gc.stderr[-3000:]
    (m,) = json.loads(gc.stdout)["log"]["metrics"]
    assert m["kind"] == "gradcheck" and m["loss"] == "ce" and m["ok"]
    assert set(m["impls"]) >= {"chunked", "pallas", "fused_lm_head"}
    argv = ["microbench", "--local", "--set", "tokens=64", "--set", "vocab=1024", "--set", "iters=2"]
    mb = tpuops(
        *argv, "--set", "impl=reference,chunked", cwd=REPO
    )  # the same as --impl reference --impl chunked
    assert mb.returncode == 0, mb.stderr[-3000:]
    # People's output: one table, the implementations side by side, p50 against the first one's.
    table = mb.stderr[mb.stderr.index("microbench (forward+backward; ratio: p50 against the first row)") :]
    rows = [ln.split("│")[1:-1] for ln in table.splitlines() if ln.startswith("│")]
    assert [r[0].strip() for r in rows] == ["reference", "chunked"], table
    assert rows[0][6].strip() == "1.00×" and float(rows[1][6].strip().rstrip("×")) > 0
    bad = tpuops(*argv, "--impl", "chunkd", cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == (
        "error: parameter impl takes one or more of reference, chunked, pallas, fused_lm_head, auto; "
        "received 'chunkd'"
    )


def test_logs_then_stop_a_detached_run(tmp_path: Path) -> None:
    args = [
        sys.executable,
        "-m",
        "tpuops",
        "sop",
        "run",
        "smoke",
        "--local",
        "--set",
        "steps=500",
        "--set",
        "step_seconds=0.05",
    ]
    follower = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert follower.stderr is not None
    while "[w0] step=3 " not in follower.stderr.readline():
        pass
    follower.kill()  # the laptop goes away; the job does not
    follower.wait()
    (record,) = json.loads(tpuops("runs", "--json", cwd=tmp_path).stdout)
    run_id = record["run_id"]
    logs = tpuops("logs", run_id, cwd=tmp_path)  # the log itself on stdout: pipeable, no [w0] prefix
    assert logs.returncode == 0 and "\nstep=3 " in logs.stdout and "[w0]" not in logs.stdout
    stop = tpuops("stop", run_id, "--json", cwd=tmp_path)
    assert stop.returncode == 0, stop.stderr
    assert "terminated" in json.loads(stop.stdout)["workers"]["0"]["detail"]
    exit_file = Path(os.environ["TPUOPS_HOME"]) / "local/w0/tpuops/runs" / run_id / "worker-0.exit"
    assert exit_file.read_text().split() == ["143", "stopped"]
    done = tpuops("logs", run_id, cwd=tmp_path)
    last = [ln for ln in done.stdout.splitlines() if ln.startswith("step=")][-1]
    assert int(last.split("step=")[1].split()[0]) < 499  # it really stopped early


# The recompile-check that fails on purpose runs on an emulated VM: tests/tpuops/cloud/test_e2e_commands.py.


def test_recompile_check_passes_with_fixed_buckets() -> None:
    # Decode in segments of 2 positions (3 attention windows for its 6 new tokens): every segment's loop is
    # compiled in step 0's one decode program, nothing after.
    sets = ("--set", "config=toy", "--set", f"data_dir={DATA}", "--set", "steps=3",
            "--set", "rollout.attention_block=2")  # fmt: skip
    r = tpuops("recompile-check", "--local", *sets, "--json", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    log = json.loads(r.stdout)["log"]
    assert log["compiles"]["after_warmup"] == 0 and log["compiles"]["total"] > 0  # logging was on


# `tpuops bench rollout` end to end: tests/tpuops/cloud/test_e2e_commands.py (two variants on an emulated VM).
