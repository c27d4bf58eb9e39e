"""`tpuops fit` as users type it: a config that fits, one that does not (exit 12 with a fix), the cache,
libtpu missing, a bad accelerator. Real compiles for TPU topologies through libtpu (no TPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.model.config import Qwen2Config

REPO = Path(__file__).resolve().parents[3]


def too_big(folder: Path) -> Path:
    """A config whose model alone (10 B parameters: 8 wide layers, an untied 152k vocabulary) is larger than one
    v5e chip's 16 GiB even in bf16: nothing fits, and every phase's compile stops at libtpu's memory check, in
    seconds (with 4 layers the bf16 prefill fitted the chip's memory and compiled in full: ~40 s of CPU)."""
    model = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 8192,
        "intermediate_size": 32768, "num_hidden_layers": 8, "num_attention_heads": 64, "num_key_value_heads": 8,
        "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    }  # fmt: skip
    return _config(folder, "too-big", model, "bfloat16", "rollout: {samples_per_prompt: 4, max_new_tokens: 16}\n"
                   "train: {prompts_per_step: 2, micro_batch: 8}\n")  # fmt: skip


def _config(folder: Path, name: str, model: dict, dtype: str, rollout_and_train: str) -> Path:
    """`folder/name/config.json` (the model's HF config) and `folder/name.yaml`, a GSM8K config on v5e-1 using it."""
    (folder / name).mkdir(parents=True, exist_ok=True)
    (folder / name / "config.json").write_text(json.dumps(model))
    cfg = folder / f"{name}.yaml"
    cfg.write_text(
        f"model: {{path: {folder / name}, dtype: {dtype}}}\n"
        "data: {task: gsm8k, prompt_buckets: [64]}\n" + rollout_and_train + "mesh: {accelerator: v5e-1}\n"
    )
    return cfg


def tpuops(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args], capture_output=True, text=True, check=False, cwd=cwd,
        env={**os.environ, "COLUMNS": "220", **(env or {})}, stdin=subprocess.DEVNULL, timeout=900,
    )  # fmt: skip


@pytest.mark.slow
def test_a_config_that_does_not_fit_is_exit_12_naming_the_phase(tmp_path: Path) -> None:
    cfg = too_big(tmp_path)
    r = tpuops("fit", str(cfg))
    assert r.returncode == 12, r.stderr[-2000:]
    verdict = [ln for ln in r.stderr.splitlines() if "does not fit" in ln]
    assert verdict and " peak " in verdict[0] and "GB usable per device" in verdict[0]
    data = json.loads(tpuops("fit", str(cfg), "--json").stdout)
    assert data["fits"] is False and data["cached"] is True
    assert not any(p["fits"] for p in data["phases"].values())  # the parameters alone exceed the chip


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


def test_a_base_install_without_jax_is_one_line_naming_the_tpu_extra(tmp_path: Path) -> None:
    """`pip install tpuops` without the tpu extra: jax is not there; fit says which extra to install (exit 2)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoJax:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'jax' or name.startswith('jax.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, _NoJax())\n"
    )
    r = tpuops("fit", "qwen2.5-0.5b-v4-8", env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "jax is not installed here: pip install 'tpuops[tpu]'" in lines[0]
    assert "PackageNotFoundError" not in r.stderr and "Traceback" not in r.stderr


def test_an_unknown_accelerator_is_one_line_exit_2() -> None:
    r = tpuops("fit", "tiny", "--accelerator", "v9-8")
    assert r.returncode == 2 and "unknown accelerator type 'v9-8'" in r.stderr and "v6e-8" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def update_too_big(folder: Path) -> Path:
    """64 sequences of 64 + 1984 tokens in one micro-batch: the prompt is short, so the prefill compiles in
    seconds; the update trains on 2048-token sequences, whose [S, S] attention scores (the XLA attention: the
    Pallas kernel on a TPU holds none) one v5e chip cannot hold without remat. The tiny model's shapes with a
    1,024-token vocabulary: with the real 151,936 the same search took 129 s of CPU instead of 81 (its LM head and
    loss are most of the update's compile), and the vocabulary is not what this test is about."""
    rollout_and_train = (
        "rollout: {samples_per_prompt: 8, max_new_tokens: 1984}\n"
        "train: {prompts_per_step: 8, micro_batch: 64, attention_impl: xla}\n"
    )
    return _config(folder, "big-update", Qwen2Config(vocab_size=1024).to_hf(), "float32", rollout_and_train)


# Makes the fit search's first candidate (`train.remat=dots`, compiled in a child `trainer.fit --no-fix`) die of
# SIGSEGV at interpreter start, as libtpu's compiler once did on a candidate (docs/performance.md): a real crash
# of a real process, the first thing the search meets.
CRASH_ON_DOTS = """import os, signal, sys
if "--no-fix" in sys.orig_argv and "--set=train.remat=dots" in sys.orig_argv:
    os.kill(os.getpid(), signal.SIGSEGV)
"""


@pytest.mark.slow
def test_an_oversized_micro_batch_gets_the_cheapest_override_that_fits_past_a_candidate_that_crashes(
    tmp_path: Path,
) -> None:
    """Only the update is too big (a 64-sequence micro-batch's attention scores): the message names the
    override that fits, found by compiling the candidates cheapest first (trainer.fit.__main__.fix_candidates,
    whose order tests/trainer/fit/test_estimate.py checks), each in its own process. The first, more remat,
    crashes the compiler here (CRASH_ON_DOTS): the search names it skipped and goes on, and the second, `mlp_up`
    (only the MLP's up projection kept), fits. The verdict made before the search stands."""
    (tmp_path / "crash").mkdir()
    (tmp_path / "crash" / "sitecustomize.py").write_text(CRASH_ON_DOTS)
    r = tpuops("fit", str(update_too_big(tmp_path)), "--json", env={"PYTHONPATH": str(tmp_path / "crash")})
    assert r.returncode == 12, r.stderr[-2000:]
    data = json.loads(r.stdout)
    assert not data["phases"]["update"]["fits"] and data["phases"]["prefill"]["fits"]
    assert data["fix_skipped"] == [
        {"set": ["train.remat=dots"], "why": "the TPU compiler crashed (signal 11)"}
    ]
    fix = data["fix"]
    # Compiled with the override, the update fits; the peak is that compile's.
    assert fix and fix["set"] == ["train.remat=mlp_up"]
    assert fix["peak_bytes"] <= data["usable_bytes_per_device"]
    assert fix["peak_bytes"] < data["phases"]["update"]["peak_bytes"]
    line = next(ln for ln in r.stderr.splitlines() if "does not fit" in ln)
    assert f"--set {fix['set'][0]}" in line and "fits (peak" in line
    assert "skipped --set train.remat=dots: the TPU compiler crashed (signal 11)" in line


@pytest.mark.slow
def test_a_config_that_fits_is_exit_0_cached_and_on_two_slices_reports_the_bytes_that_cross_dcn() -> None:
    """tiny on 2 x v5e-4 (libtpu's multislice topology): it fits (exit 0, every phase with >= 10% headroom, the
    people's table on stderr) and the verdict is cached. The mesh's dcn axis is the slices, the update's gradients
    cross DCN once per update (their bytes per device, not once per micro-batch), and the time is those bytes per
    host at the cited bandwidth. One test, not two: each `tpuops fit` of tiny compiles its four phases for a TPU,
    ~75 s of CPU, and the multislice compile proves what the one-slice one did."""
    sets = ["--set", "train.micro_batch=8", "--set", "train.prompts_per_step=4"]
    r = tpuops("fit", "tiny", "--accelerator", "v5e-4", "--slices", "2", *sets, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result["fits"] and not result["cached"] and result["topology"] == "v5e:2x2"
    assert set(result["phases"]) == {"decode_cast", "prefill", "decode", "update"}
    assert all(p["headroom"] >= 0.10 for p in result["phases"].values())
    assert "fits: tightest phase" in r.stderr and "update" in r.stderr  # the people's table, on stderr
    est = result["estimate"]  # the bound's line names the device's share and the host's
    device = sum(est["phases_s"].values())
    assert est["bound_s"] == pytest.approx(device + est["host_s"])
    assert f"bound: {est['bound_s']:.2f} s per step (device {device:.3f} s: " in r.stderr
    assert f"host work {est['host_s']:.2f} s" in r.stderr
    assert (result["slices"], result["devices"], result["accumulation"]) == (2, 8, 2)
    assert result["mesh"] == {"dcn": 2, "dp": 1, "fsdp": 4, "tp": 1}
    dcn = result["dcn"]
    assert dcn["bytes_per_device"] == sum(dcn["phases"].values()) > 0
    # Every device's gradient shard is reduced over DCN once, after the 2 micro-batches (+ a few statistics);
    # reduced inside each micro-batch's backward it was 4.0x (docs/performance.md).
    assert result["params_bytes"] <= dcn["phases"]["update"] <= 1.1 * result["params_bytes"]
    assert (
        dcn["bytes_per_host"]
        == dcn["bytes_per_device"] * dcn["devices_per_host"]
        == dcn["bytes_per_device"] * 4
    )
    assert dcn["seconds"] == pytest.approx(dcn["bytes_per_host"] / 2.5e10)
    assert dcn["dominates"] == (dcn["seconds"] > dcn["step_bound_s"])
    assert "DCN (2 slices)" in r.stderr
    assert (
        result["cost"]["chips"] == 8 and result["cost"]["accelerator"] == "2 x v5e-4"
    )  # both slices paid for
    again = tpuops("fit", "tiny", "--accelerator", "v5e-4", "--slices", "2", *sets, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["cached"] is True
    bad = tpuops("fit", "tiny", "--accelerator", "v5e-4", "--slices", "0")
    assert bad.returncode == 2 and "--slices must be 1 or more, received 0" in bad.stderr
