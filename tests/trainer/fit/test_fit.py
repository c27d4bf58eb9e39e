"""Ahead-of-time compiles for TPU topologies on this CPU machine (libtpu, no TPU): the trainer's own update
is FSDP (weights gathered, gradients reduce-scattered; no whole-batch activation all-reduce), and every
shipped TPU config fits its target with >= 10% headroom in every phase."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import fits
from trainer import config
from trainer.fit import tpus
from trainer.fit.__main__ import _quiet_libtpu, compare_layouts, run
from trainer.fit.text import render_layouts
from trainer.model.config import Qwen2Config


@pytest.fixture
def small_model(tmp_path: Path) -> Path:
    """A model folder whose activations dwarf its weights: an all-reduce of activations would stand out."""
    shape = Qwen2Config(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(shape.to_hf()))
    return tmp_path / "model"


def _compile_for(accelerator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer.fit's environment for compiling on this CPU for `accelerator`, restored after the test."""
    for k in ("ALLOW_MULTIPLE_LIBTPU_LOAD", "TPU_SKIP_MDS_QUERY", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES",
              "TF_CPP_MIN_LOG_LEVEL"):  # fmt: skip
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    _quiet_libtpu(accelerator)


@pytest.mark.slow
def test_update_is_fsdp_gathering_weights_not_reducing_activations(
    small_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _compile_for("v6e-8", monkeypatch)
    cfg = config.load("tiny", [
        f"model.path={small_model}", "model.dtype=bfloat16", "data.prompt_buckets=128", "rollout.max_new_tokens=128",
        "rollout.samples_per_prompt=8", "train.prompts_per_step=8", "train.micro_batch=64", "train.loss_impl=pallas",
    ])  # fmt: skip
    # The update alone: the other phases and the host's work are not what this test checks.
    result = run(cfg, tpus.from_accelerator("v6e-8"), [], fix=False, only=("update",), host=False)
    update = result["phases"]["update"]
    params_f32 = result["params_bytes"] * 8  # every device holds 1/8 of the float32 parameters
    activation = 64 * 256 * 256 * 2  # one layer's [B, S, D] bfloat16 activations of the micro-batch
    # What is all-reduced is at most gradient-sized (the gradients, norms, scalars), never the activations;
    # each layer's weights are all-gathered (FSDP).
    assert update["collective_bytes"]["all-reduce"] <= params_f32 < activation
    # Gathered whole (train.collective_matmul false, the default), not as XLA's ring of collective-permuted
    # pieces: with the option on, this update moves ~15x more by collective-permute than by all-gather.
    collective = update["collective_bytes"]
    assert collective["all-gather"] > collective["collective-permute"], collective
    # No replicated copy: the update's arguments are params + Adam moments split 8 ways (+ the batch).
    state = result["params_bytes"] + result["opt_state_bytes"]
    assert state <= update["argument_bytes"] <= state + 64 * 256 * 4 * 8
    assert result["impl"] == "pallas" and update["fits"]


@pytest.mark.slow
def test_the_decode_reduce_scatters_its_layers_rows_and_splits_the_lm_head_over_the_slice(
    small_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rollout.tp 4 over 2 kv heads on a v6e-8 (dp 2 x (kv heads x sequences, 2 x 2)). The residual stream's rows
    split over the whole tp group, so every collective that runs once a layer and position is a reduce-scatter
    (the attention's output over tp, the MLP's over the group: libtpu's fused all-reduce-scatter) or an all-gather
    of rows (before the MLP over the group, before the attention over tp), each moving a quarter or half of the
    rows; left at the batch's layout, the same layers all-reduced the attention's output and the MLP's. The LM
    head's vocabulary splits over all 8 devices: once a position the slice's last hidden rows are gathered over
    the 8 and the draw's token and log-prob summed over them, and the weight itself never moves."""
    from trainer.fit import hlo, programs
    from trainer.fit.__main__ import topology_devices
    from trainer.kernels.logprob.blocks import compile_target

    _compile_for("v6e-8", monkeypatch)
    cfg = config.load("tiny", [
        f"model.path={small_model}", "model.dtype=bfloat16", "data.prompt_buckets=128", "rollout.max_new_tokens=8",
        "rollout.samples_per_prompt=8", "train.prompts_per_step=8", "rollout.tp=4",
    ])  # fmt: skip
    devices = topology_devices(tpus.from_accelerator("v6e-8").topology)
    with compile_target(f"tpu {devices[0].device_kind}"):
        progs, facts = programs.step_programs(cfg, devices, ("decode",))
        decode = next(p for p in progs if p.name == "decode")
        text = (decode.compiled or decode.lowered.compile()).as_text()
    assert facts["rollout_mesh"] == {"dcn": 1, "dp": 2, "fsdp": 1, "tps": 2, "tp": 2}
    ops = hlo.collective_ops(hlo.parse(text, decode.loop_trips), len(devices))
    per_layer = max(op.runs for op in ops)  # the layer scan's body: positions x layers runs
    layer_ops = sorted((op.kind, op.result_bytes, len(op.group)) for op in ops if op.runs == per_layer)
    rows, D = 64 // 2, 256  # a dp group's rows, each [D] in bfloat16
    assert layer_ops == [
        ("all-gather", rows // 2 * D * 2, 2),  # the tps pair's rows, gathered over tp for the attention
        ("all-gather", rows * D * 2, 4),  # the group's rows for the MLP
        ("reduce-scatter", rows // 4 * D * 2, 2),  # the attention's output, by kv head over tp
        ("reduce-scatter", rows // 4 * D * 2, 4),  # the MLP's, over the group
    ], layer_ops
    per_position = {(op.kind, op.result_bytes, len(op.group)) for op in ops if op.runs == per_layer // 2}
    assert ("all-gather", 2 * rows * D * 2, 8) in per_position  # the slice's rows, for the LM head
    assert ("all-reduce", 2 * rows * 2 * 4, 8) in per_position  # each row's token and log-prob, float32
    assert max(op.result_bytes for op in ops) < 1024 * D * 2 // 8  # less than an eighth of W


@pytest.mark.slow
def test_layouts_compares_every_decode_layout_fastest_expected_first(
    small_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--layouts`: the rollout programs at every rollout.tp dividing the 4 devices and the 8 query heads, judged
    by the estimate; the fitting ones by expected midpoint, `best` the first, `current` the automatic choice
    (the kv-head count)."""
    _compile_for("v6e-4", monkeypatch)
    cfg = config.load("tiny", [
        f"model.path={small_model}", "model.dtype=bfloat16", "data.prompt_buckets=128", "rollout.max_new_tokens=16",
        "rollout.samples_per_prompt=8", "train.prompts_per_step=8", "train.micro_batch=64",
    ])  # fmt: skip
    r = compare_layouts(cfg, tpus.from_accelerator("v6e-4"), [])
    rows = r["layouts"]
    assert sorted(x["tp"] for x in rows) == [1, 2, 4] and r["current"] == 2
    assert all(x["rollout_mesh"]["dp"] * x["tp"] == 4 and x["bound_s"] > 0 for x in rows)
    fitting = [x for x in rows if x["fits"]]
    assert fitting and r["best"] == fitting[0]["tp"] == rows[0]["tp"]
    mids = [x["expected_mid_s"] for x in fitting]
    assert mids == sorted(mids) and len({round(x["bound_s"], 6) for x in rows}) > 1  # the layouts differ
    text = render_layouts({**r, "config": "small"})
    assert "(current)" in text.splitlines()[2 + [x["tp"] for x in rows].index(2)]


def test_every_shipped_preset_is_compiled_by_the_presets_check_or_covered_by_one_it_compiles() -> None:
    """A preset another one covers (same model, TPU and batch layout, smaller shapes) is not compiled twice: the
    seed's 3B workload covers the half-decode 3B preset. Every other preset is compiled, largest first."""
    compiled = fits.shipped()
    assert len(compiled) >= 4 and "qwen2.5-3b-v6e-8-seed" in compiled
    assert "qwen2.5-3b-v6e-8" not in compiled and fits.covered("qwen2.5-3b-v6e-8", "qwen2.5-3b-v6e-8-seed")
    # The larger workload is never left out.
    assert not fits.covered("qwen2.5-3b-v6e-8-seed", "qwen2.5-3b-v6e-8")
    for left_out in set(fits.presets()) - set(compiled):
        assert any(fits.covered(left_out, p) for p in compiled), left_out
    sizes = [fits._billions(p) for p in compiled]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] >= 7


@pytest.mark.slow
# CI's own step after the suite (.ci/run), skipped unless --presets (tests/conftest.py): five full-depth TPU
# compiles of 0.5B-7B models, 16 min alone on a 2-core machine (964 s in CI, 2026-11-28).
@pytest.mark.presets
@pytest.mark.timeout(2700)
def test_every_shipped_tpu_config_fits_its_tpu(
    shipped_fits: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    """Full-depth compiles of every shipped preset for its own TPU (mesh.accelerator), started in the background
    when collection ends (conftest.py): every phase keeps >= 10% of HBM free, with the Pallas kernels on the
    update path. The presets compiled are tests/fits.py's `shipped()` (the test above checks its choice)."""
    assert sorted(shipped_fits) == sorted(fits.shipped())
    for preset, r in shipped_fits.items():
        assert r.returncode == 0, (preset, r.stdout[-2000:], r.stderr[-3000:])
        result = json.loads(r.stdout)
        assert result["impl"] == "pallas"  # loss_impl auto on a TPU: the Mosaic kernels, sharded
        assert result["accelerator"] == config.load(preset).mesh.accelerator
        assert result["fits"] and result["headroom"] >= 0.10, preset
        for name, phase in result["phases"].items():
            assert phase["headroom"] >= 0.10, (preset, name, phase["peak_bytes"])
        assert set(result["phases"]) >= {"decode_cast", "prefill", "decode", "update"}
        est = result["estimate"]
        assert 0 < est["bound_s"] < est["expected_s"][0] <= est["expected_mid_s"] <= est["expected_s"][1]
        for name in result["phases"]:  # what `tpuops fit`'s status line shows while it waits
            assert f"fit: compiling {name}\n" in r.stderr and f"fit: compiled {name} in " in r.stderr, name


@pytest.mark.slow
def test_remat_auto_compiles_the_update_per_candidate_until_one_fits(
    small_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`train.remat: auto` for a TPU: the update compiled with none first (it fits here with room to spare, so
    nothing else compiles); the winner's measurement is the update phase, and the verdict says which and why."""
    from tpuops.checks.fit import summary

    _compile_for("v6e-8", monkeypatch)
    cfg = config.load("tiny", [
        f"model.path={small_model}", "model.dtype=bfloat16", "data.prompt_buckets=128", "rollout.max_new_tokens=128",
        "rollout.samples_per_prompt=8", "train.prompts_per_step=8", "train.micro_batch=64", "train.remat=auto",
    ])  # fmt: skip
    result = run(cfg, tpus.from_accelerator("v6e-8"), [], fix=False, only=("update",), host=False)
    auto = result["remat_auto"]
    assert result["remat"] == auto["policy"] == "none" and list(auto["peaks"]) == ["none"]
    assert auto["peaks"]["none"] == result["phases"]["update"]["peak_bytes"]  # the winner, not compiled again
    assert auto["why"].startswith("none: peak ") and "(90% of 34.36 GB)" in auto["why"]
    assert summary({**result, "config": "tiny"}).endswith(f"; remat auto: {auto['why']}")
