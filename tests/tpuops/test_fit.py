"""`tpuops fit` as users type it: a config that fits, one that does not (exit 12 with a fix), the cache,
libtpu missing, a bad accelerator. Real compiles for TPU topologies through libtpu (no TPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The tiny model with a batch and sequence no single v5e chip holds: the prefill's attention scores alone
# ([64, 4 heads, 4096, 4096] float32) are larger than its 16 GiB.
TOO_BIG = """\
model: {path: tiny, preset: tiny, dtype: bfloat16}
data: {task: gsm8k, prompt_buckets: [4096]}
rollout: {samples_per_prompt: 8, max_new_tokens: 4096}
train: {prompts_per_step: 8, micro_batch: 64}
mesh: {accelerator: v5e-1}
"""


def tpuops(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args], capture_output=True, text=True, check=False, cwd=cwd,
        env={**os.environ, "COLUMNS": "220", **(env or {})}, stdin=subprocess.DEVNULL, timeout=900,
    )  # fmt: skip


@pytest.mark.slow
def test_a_config_that_fits_is_exit_0_and_the_verdict_is_cached() -> None:
    r = tpuops("fit", "tiny", "--accelerator", "v6e-8", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result["fits"] and not result["cached"] and result["topology"] == "v6e:2x4"
    assert set(result["phases"]) == {"decode_cast", "prefill", "decode", "update"}
    assert all(p["headroom"] >= 0.10 for p in result["phases"].values())
    assert "fits: tightest phase" in r.stderr and "update" in r.stderr  # the people's table, on stderr
    again = tpuops("fit", "tiny", "--accelerator", "v6e-8", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["cached"] is True


@pytest.mark.slow
def test_a_config_that_does_not_fit_is_exit_12_naming_the_phase(tmp_path: Path) -> None:
    cfg = tmp_path / "too-big.yaml"
    cfg.write_text(TOO_BIG)
    r = tpuops("fit", str(cfg))
    assert r.returncode == 12, r.stderr[-2000:]
    verdict = [ln for ln in r.stderr.splitlines() if "does not fit" in ln]
    assert verdict and "update peak" in verdict[0] and "GB usable per device" in verdict[0]
    data = json.loads(tpuops("fit", str(cfg), "--json").stdout)
    assert data["fits"] is False and data["phases"]["prefill"]["fits"] is False and data["cached"] is True


def test_without_libtpu_fit_names_the_pip_command(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoLibtpu:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'libtpu' or name.startswith('libtpu.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, _NoLibtpu())\n"
    )
    r = tpuops("fit", "tiny", "--accelerator", "v6e-8", env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 2
    assert "libtpu is not installed: pip install 'jax[tpu]==" in r.stderr
    assert "Traceback" not in r.stderr


def test_an_unknown_accelerator_is_one_line_exit_2() -> None:
    r = tpuops("fit", "tiny", "--accelerator", "v9-8")
    assert r.returncode == 2 and "unknown accelerator type 'v9-8'" in r.stderr and "v6e-8" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


UPDATE_TOO_BIG = """\
model: {path: tiny, preset: tiny, dtype: float32}
data: {task: gsm8k, prompt_buckets: [1024]}
rollout: {samples_per_prompt: 8, max_new_tokens: 1024}
train: {prompts_per_step: 16, micro_batch: 128}
mesh: {accelerator: v5e-1}
"""


@pytest.mark.slow
def test_an_oversized_micro_batch_gets_the_cheapest_override_that_fits(tmp_path: Path) -> None:
    """Only the update is too big (a 128-sequence micro-batch's attention scores): the message names the
    override that fits, found by compiling the candidates (more remat first, then smaller micro-batches)."""
    cfg = tmp_path / "big-update.yaml"
    cfg.write_text(UPDATE_TOO_BIG)
    r = tpuops("fit", str(cfg), "--json")
    assert r.returncode == 12, r.stderr[-2000:]
    data = json.loads(r.stdout)
    assert not data["phases"]["update"]["fits"] and data["phases"]["prefill"]["fits"]
    fix = data["fix"]
    assert fix and all(s.startswith(("train.remat=", "train.micro_batch=")) for s in fix["set"])
    assert fix["peak_bytes"] <= data["usable_bytes_per_device"]
    line = next(ln for ln in r.stderr.splitlines() if "does not fit" in ln)
    assert f"--set {fix['set'][0]}" in line and "fits (peak" in line
    fixed = tpuops("fit", str(cfg), *(a for s in fix["set"] for a in ("--set", s)))
    assert fixed.returncode == 0, fixed.stderr[-2000:]  # the named fix really fits
