"""bench/device_session.sh, the one command of a device session: its plan (probe, the seed's workload before,
each decode change as its own variant, tunix) fits its budget, and its CPU mode writes one record per seed run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "device_session.sh"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHON": sys.executable, "PYTHONPATH": str(REPO),
           "DEVICE_SESSION_RESULTS": str(tmp_path / "results"), **extra}  # fmt: skip
    for k in ("XLA_FLAGS", "DEVICE_STEP_RESULTS", "DEVICE_STEP_SETS", "DEVICE_STEP_XLA_FLAGS", "OUT"):
        env.pop(k, None)
    return env


def _plan(tmp_path: Path, **extra: str) -> tuple[list[tuple[str, str, str]], dict[str, int]]:
    r = subprocess.run(["bash", str(SCRIPT)], env=_env(tmp_path, DEVICE_SESSION_PLAN="1", **extra),
                       capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    lines = r.stdout.splitlines()
    parts = [(w[1], w[2], w[3]) for w in (x.split() for x in lines if x.startswith("part "))]
    words = next(x.split() for x in lines if x.startswith("budget "))
    return parts, {"budget": int(words[1]), "variant_min": int(words[3])}


def test_the_plan_measures_one_change_at_a_time_within_one_device_call(tmp_path: Path) -> None:
    parts, limits = _plan(tmp_path)
    assert [p[0] for p in parts] == ["probe", "before", "cudnn", "pallas", "cmdbuf", "eos8", "tunix"]
    settings = dict((name, setting) for name, _, setting in parts)
    assert settings["before"] == "DEVICE_STEP_PROFILE=update"  # today's defaults, its update then profiled
    assert settings["cmdbuf"] == "DEVICE_STEP_XLA_FLAGS=--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
    assert settings["cudnn"] == "DEVICE_STEP_SETS=train.attention_impl=cudnn"
    assert settings["eos8"] == "DEVICE_STEP_SETS=rollout.eos_check_every=8"
    assert settings["pallas"] == "DEVICE_STEP_SETS=rollout.attention_impl=pallas"
    assert limits["budget"] <= 580  # one device call runs 600 s at most
    caps = dict((name, cap) for name, cap, _ in parts)
    # the seed's cold compile is about 115 s on an H200, its step 22 s and its update 14 s: before's start, warm-up
    # step, one timed step and its update's profile (the update and 20 s) fit its cap, and what is left holds two
    # variants
    assert int(caps["probe"]) + int(caps["before"]) >= 20 + 30 + 115 + 2 * 22 + 14 + 20
    assert limits["budget"] - int(caps["probe"]) - int(caps["before"]) >= 2 * limits["variant_min"]
    assert all(
        caps[v] == "rest" for v in ("cudnn", "pallas", "cmdbuf", "eos8")
    )  # each runs on what the parts before left
    only, _ = _plan(tmp_path, DEVICE_SESSION_PARTS="tunix")
    assert [p[0] for p in only] == ["tunix"]
    assert int(caps["tunix"]) <= 240  # a second call, in what is left of the 15 device minutes


@pytest.mark.slow  # about 30 s on a 2-core CPU: two trainer processes compile the tiny model's step
def test_the_cpu_mode_writes_a_record_per_seed_run_with_its_variant(tmp_path: Path) -> None:
    env = _env(tmp_path, DEVICE_STEP_SIZES="tiny", DEVICE_SESSION_PARTS="probe,before,cudnn",
               JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"))  # fmt: skip
    r = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "jax " in r.stdout and "device_session: done" in r.stdout
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "results").glob("*.json"))]
    # before's budget is its cap less 5 s; a variant's, what the session had left less 5 s
    commands = sorted(re.sub(r"BUDGET_S=\d+", "BUDGET_S=N", rec["command"]) for rec in records)
    assert commands == [
        "DEVICE_STEP_SIZES=tiny DEVICE_STEP_BUDGET_S=N DEVICE_STEP_PROFILE=update DEVICE_STEP_STEPS=1 "
        "bash bench/device_step.sh",
        "DEVICE_STEP_SIZES=tiny DEVICE_STEP_BUDGET_S=N DEVICE_STEP_SETS=train.attention_impl=cudnn "
        "DEVICE_STEP_STEPS=1 bash bench/device_step.sh",
    ]
    budgets = {
        "cudnn" in rec["command"]: int(re.findall(r"BUDGET_S=(\d+)", rec["command"])[0]) for rec in records
    }
    assert (
        budgets[False] == 115 and 115 < budgets[True] < 560 - 5
    )  # the probe and before took some of the 560 s
    assert all(rec["step_s"] > 0 and rec["config"] == "tiny" for rec in records)
    # before's update profiled once more after its timed step: a real trace, read back (a CPU has no GPU kernels,
    # only the host's threads); the variant's not
    profiles = {"cudnn" in rec["command"]: rec.get("update_profile") for rec in records}
    assert profiles[True] is None
    assert profiles[False] and profiles[False]["file"].endswith(".trace.json.gz"), profiles[False]
    assert profiles[False]["processes_ms"] and profiles[False]["device_kernel_ms"] == 0.0
