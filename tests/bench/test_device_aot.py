"""The update's compile as bench/device_step.py runs it on a GPU and bench/device_aot.py predicts it without one
(`device_workload.compile_update`): the micro-batch halves while the compiled update does not fit beside the state,
and `train.remat: auto` passes over a policy the memory limit rules out, the winner's executable kept. Real
compiles of the tiny model on CPU, with the memory limit a GPU would report given by hand. The deviceless H200
compile itself needs jax's CUDA plugin (bench/device_aot.py's docstring) and runs where it is installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import pytest

from trainer import config
from trainer.fit import programs as fp
from trainer.loop.remat import HEADROOM

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import device_workload as dw  # noqa: E402 (bench/ is no package)

W = {"prompts": 2, "samples": 2, "prompt_len": 16, "new_tokens": 8}


def _compile(remat: str, micro: int, limit: int | None, in_use: int) -> dict[str, Any]:
    sets = [*dw.trainer_sets("tiny", "float32", W), "mesh.devices=1", f"train.remat={remat}"]
    cfg = config.load("tiny", sets)
    mconf = fp.model_config(cfg)
    mesh = fp.training_mesh(cfg, jax.devices())
    params, opt_state = fp.state(cfg, mconf, mesh)
    N = W["prompts"] * W["samples"]
    batch = fp.update_batch_like(mesh, N, W["prompt_len"], W["new_tokens"])
    args = (params, opt_state, batch, jax.ShapeDtypeStruct((), "int32"))
    return dw.compile_update(
        cfg, mconf, W["prompt_len"], "reference", args, micro, limit, in_use, say=lambda _: None
    )


@pytest.fixture(autouse=True)
def _no_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DEVICE_STEP_SETS", "DEVICE_STEP_LAYERS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.slow  # six compiles of the tiny update, about 15 s
def test_the_micro_batch_halves_until_the_update_fits_in_92_percent_of_what_is_free() -> None:
    need = {
        m: _compile("full", m, None, 0) for m in (4, 2, 1)
    }  # no limit known (a CPU): the first micro-batch
    assert all(r["micro_batch"] == m and r["compiles"] == 1 and r["free"] == 0 for m, r in need.items())
    in_use = 10**9
    for free in (int(need[4]["need"] / 0.92) - 1, int(min(r["need"] for r in need.values()) / 0.92) - 1):
        # 4 misses by a byte (then the first of 2, 1 that fits, else 1); then none fits (1, the floor)
        out = _compile("full", 4, in_use + free, in_use)
        expected = next((m for m in (2, 1) if need[m]["need"] <= 0.92 * free), 1)
        assert (out["micro_batch"], out["need"]) == (expected, need[expected]["need"])
        assert out["compiles"] == {4: 1, 2: 2, 1: 3}[expected]
    roomy = _compile("full", 4, in_use + int(need[4]["need"] / 0.92) + 1, in_use)
    assert (roomy["micro_batch"], roomy["compiles"]) == (4, 1)


def test_remat_auto_passes_over_a_policy_the_limit_rules_out_and_keeps_the_winner_s_executable() -> None:
    free = _compile("auto", 4, 10**15, 0)
    assert free["remat"].policy == "none" and free["compiles"] == 1
    none_peak = free["remat"].peaks["none"]
    tight = _compile("auto", 4, int(none_peak / (1 - HEADROOM)) - 1, 0)
    choice = tight["remat"]
    assert choice.policy != "none" and choice.peaks["none"] == none_peak
    assert tight["compiles"] == len(choice.peaks) >= 2
    m = tight["executable"].memory_analysis()
    kept = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    assert kept == choice.peaks[choice.policy]


@pytest.mark.slow  # the tiny model's programs compiled for an H200, three times
@pytest.mark.parametrize("attention", ["xla", "cudnn", "pallas-decode"])
def test_the_tiny_step_compiles_for_an_h200_without_one(tmp_path: Path, attention: str) -> None:
    """The update's and prefill's attention as xla or cuDNN's; the decode's as the Pallas GPU kernel (Triton,
    compiled for the card's sm_90 without it: one call per layer in the decode loop's body, none elsewhere)."""
    pytest.importorskip("jax_plugins.xla_cuda13", reason="jax's CUDA plugin is not installed here")
    sets = (
        "rollout.attention_impl=pallas"
        if attention == "pallas-decode"
        else f"train.attention_impl={attention}"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), "DEVICE_STEP_SIZES": "tiny",
           "DEVICE_STEP_SETS": sets}  # fmt: skip
    env.pop("XLA_FLAGS", None)
    out = tmp_path / "aot.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "device_aot.py"), "--card", "h200", "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device_kind"] == "NVIDIA H200" and result["fits"]
    assert set(result["programs"]) == {"decode_cast", "prefill", "decode", "update"}
    update = result["programs"]["update"]
    assert (update["cudnn_calls"] > 0) == (attention == "cudnn")
    assert result["attention"]["update"] == ("xla" if attention == "pallas-decode" else attention)
    triton = {name: p["triton_calls"] for name, p in result["programs"].items()}
    decode_kernels = 0 if attention != "pallas-decode" else 2 * len(result["decode_loop_kernels"])  # 2 layers
    assert triton == {"decode_cast": 0, "prefill": 0, "decode": decode_kernels, "update": 0}
    # xla's decode attention copies its window out of the cache every position; the kernel reads it in place
    copies = result["decode_cache_copies_mib"]
    assert len(copies) == len(result["decode_loop_kernels"])
    assert (max(copies) == 0) == (attention == "pallas-decode"), copies


# A compiled GPU program's shape, cut down: a loop whose body slices the cache (one 2x4x8 bf16 copy and a
# tuple-typed one of two 1x4 f32), calls a kernel, and a branch of two kernels; the entry's kernels are not the loop's.
_SLICE = 'metadata={op_name="jit(_decode)/while/body/DecoderLayer/self_attn/dynamic_slice"}'
_KERNEL = 'metadata={op_name="jit(_decode)/while/body/decode_attention/pallas_call"}'
HLO = f"""HloModule m

%body.1 (p: (s32[], bf16[2,4,16])) -> (s32[], bf16[2,4,16]) {{
  %p = (s32[], bf16[2,4,16]) parameter(0)
  %gte = bf16[2,4,16]{{2,1,0}} get-tuple-element(%p), index=1
  %slice_fusion = bf16[2,4,8]{{2,1,0}} fusion(%gte), kind=kLoop, calls=%f1, {_SLICE}
  %pair = (f32[1,4]{{1,0}}, f32[1,4]{{1,0}}) fusion(%gte), kind=kLoop, calls=%f2, {_SLICE}
  %other = bf16[2,4,8]{{2,1,0}} fusion(%slice_fusion), kind=kLoop, calls=%f3
  %k = bf16[2,4,8]{{2,1,0}} custom-call(%other), custom_call_target="__gpu$xla.gpu.triton", {_KERNEL}
  %c = s32[] conditional(%p), branch_computations={{%b1, %b2}}
  ROOT %t = (s32[], bf16[2,4,16]) tuple(%c, %gte)
}}

%b1 (x: s32[]) -> s32[] {{
  %x = s32[] parameter(0)
  %a = s32[] fusion(%x), kind=kLoop, calls=%f4
  ROOT %b = s32[] fusion(%a), kind=kLoop, calls=%f5
}}

ENTRY %main (a: (s32[], bf16[2,4,16])) -> (s32[], bf16[2,4,16]) {{
  %a = (s32[], bf16[2,4,16]) parameter(0)
  %e = bf16[2,4,16]{{2,1,0}} fusion(%a), kind=kLoop, calls=%f6
  ROOT %w = (s32[], bf16[2,4,16]) while(%a), condition=%cond.1, body=%body.1
}}
"""


def test_the_loop_body_is_read_from_the_compiled_text() -> None:
    """Kernels per iteration (the branch's two, + 1 for the condition's test), the cache bytes its slices copy
    (a tuple's members summed), and its kernels listed with their source ops; the entry's fusion is not the loop's."""
    import device_aot

    assert device_aot.loop_kernels(HLO) == [3 + 2 + 1 + 1]
    assert device_aot.slice_copies(HLO) == [2 * 4 * 8 * 2 + 2 * 4 * 4]
    assert device_aot._shape_bytes("(f32[1,4]{1,0}, bf16[2,4,8]{2,1,0})") == 16 + 128
    body = device_aot.body_kernels(HLO)
    assert [row.split()[0] for row in body] == ["fusion", "fusion", "fusion", "custom-call", "conditional"]
    assert body[3].endswith("decode_attention/pallas_call") and "bf16[2,4,8]" in body[0]
