"""The README's main job end to end: `tpuops run grpo --local` runs the bundled trainer on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def tpuops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the exit code is what these tests check
        [sys.executable, "-m", "tpuops", *args],
        cwd=cwd, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""},
    )  # fmt: skip


@pytest.mark.slow
def test_run_grpo_locally_reports_steps() -> None:
    r = tpuops("run", "grpo", "--local", "--set", "steps=3", "--json", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(r.stdout)
    assert data["ok"] and data["error_class"] == "ok"
    log = data["log"]
    assert log["steps"] == 3 and log["first_step"] == 0 and log["last_step"] == 2
    assert log["start"]["backend"] == "cpu" and log["summary"]["steps"] == 3
    assert not log["failures"]
    assert "[w0] step=2 " in r.stderr  # followed live, prefixed with the worker
    home = Path(os.environ["TPUOPS_HOME"])
    assert (home / "runs" / data["run_id"] / "worker-0.log").exists()


def test_trainer_override_typo_is_refused_before_anything_runs() -> None:
    r = tpuops("run", "grpo", "--local", "--set", "train.stepz=3", cwd=REPO)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "error: trainer config: unknown config key 'train.stepz'; did you mean 'train.steps'?"
    )
    assert not (Path(os.environ["TPUOPS_HOME"]) / "local").exists()  # no worker was touched
