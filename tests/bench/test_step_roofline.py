"""bench/step_roofline.py: the analytic counts device_step.sh prints beside its measurements."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import step_roofline  # noqa: E402

from trainer.model.config import Qwen2Config  # noqa: E402

CONFIGS = ROOT / "tests" / "fixtures" / "data" / "qwen2.5-configs"


def shapes(name: str) -> Qwen2Config:
    return Qwen2Config.from_hf(json.loads((CONFIGS / f"Qwen2.5-{name}-Instruct.json").read_text()))


@pytest.mark.parametrize(
    ("name", "published"), [("0.5B", 494_032_768), ("1.5B", 1_543_714_304), ("3B", 3_085_938_688)]
)
def test_matmul_weights_are_the_published_parameter_count_less_biases_and_norms(
    name: str, published: int
) -> None:
    m = shapes(name)
    weights = m.num_hidden_layers * step_roofline.layer_weights(m) + m.hidden_size * m.vocab_size
    assert 0 < published - weights < 0.001 * published  # only the biases and norm scales are left out


def test_the_presets_workload_decodes_hbm_bound_and_updates_compute_bound_on_an_h100() -> None:
    m, gpu = shapes("3B"), step_roofline.GPUS["h100"]
    n_params = m.num_hidden_layers * step_roofline.layer_weights(m) + m.hidden_size * m.vocab_size
    c = step_roofline.phase_counts(m, n_params, [142] * 128, 512, 512, 511, 16)
    assert c["decode"]["bytes"] / gpu.hbm_bw > 2 * c["decode"]["flops"] / gpu.bf16_flops
    assert c["update"]["flops"] / gpu.bf16_flops > 3 * c["update"]["bytes"] / gpu.hbm_bw
    # Each decode iteration reads every bf16 weight once: at least 2 bytes per parameter per iteration.
    assert c["decode"]["bytes"] > 511 * 2 * n_params
    # The update is 3 forwards: 6 FLOPs per layer weight per token of the 128 x 1024 sequences, plus attention
    # and the LM head on the 512 completion positions only (so less than 6 per parameter per token).
    body = m.num_hidden_layers * step_roofline.layer_weights(m)
    assert 6 * body * 128 * 1024 < c["update"]["flops"] < 6 * n_params * 128 * 1024


def test_longer_prompts_cost_the_decode_more_bytes() -> None:
    m = shapes("0.5B")
    short = step_roofline.phase_counts(m, 1, [100] * 8, 512, 64, 63, 1)["decode"]["bytes"]
    long = step_roofline.phase_counts(m, 1, [500] * 8, 512, 64, 63, 1)["decode"]["bytes"]
    kv_per_token = m.num_hidden_layers * 2 * m.num_key_value_heads * m.head_dim * 2
    assert long - short == 8 * 400 * 63 * kv_per_token
    # Rows in groups of 4 sharing a prompt: the prompt's keys/values read and its prefill run once per group.
    grouped = step_roofline.phase_counts(m, 1, [500] * 8, 512, 64, 63, 1, samples=4)
    assert long - grouped["decode"]["bytes"] == 6 * 500 * 63 * kv_per_token
    alone = step_roofline.phase_counts(m, 1, [500] * 8, 512, 64, 63, 1)["prefill"]["flops"]
    assert grouped["prefill"]["flops"] == pytest.approx(alone / 4)


def test_gpu_peaks_by_device_kind() -> None:
    assert step_roofline.gpu_for("NVIDIA H100 80GB HBM3") == (step_roofline.GPUS["h100"], "")
    assert step_roofline.gpu_for("NVIDIA H200")[0].hbm_bw == 4.8e12
    gpu, note = step_roofline.gpu_for("cpu")
    assert gpu.name == "H100 SXM" and "H100" in note


def test_a_size_that_failed_renders_its_error_under_an_aligned_row() -> None:
    ok = {
        "size": "0.5b",
        "status": "ok",
        "measured": {"step_s": 2.0, "decode_mbu": 0.41},
        "estimate": {"step_s": 0.5},
    }
    bad = {"size": "3b", "status": "timeout", "error": "killed at its 216 s cap"}
    head, row_ok, row_bad, err = step_roofline.render([ok, bad]).splitlines()
    assert len(row_ok) == len(row_bad) == head.index("batch")  # no workload given: the batch column is empty
    assert "4.0" in row_ok and "41%" in row_ok
    assert err.strip() == "error: killed at its 216 s cap"
