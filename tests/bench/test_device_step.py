"""bench/device_step.py's CPU mode (`DEVICE_STEP_SIZES=tiny`) runs, and the results record it writes holds every
field `tpuops fit`'s calibration reads (tpuops/checks/calibrate.py FIELDS) and is never a calibration basis."""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuops.checks import calibrate

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import device_workload  # noqa: E402 (bench/ is no package)
import results_record  # noqa: E402


@pytest.mark.slow  # about 45 s on a 2-core CPU: two trainer processes compile the tiny model's step
def test_the_cpu_mode_runs_and_writes_a_record_the_calibration_reads(tmp_path: Path) -> None:
    before = sorted(p.name for p in (REPO / "bench" / "results").iterdir())
    env = {**os.environ, "DEVICE_STEP_SIZES": "tiny", "JAX_PLATFORMS": "cpu", "PYTHON": sys.executable,
           "PYTHONPATH": str(REPO), "OUT": str(tmp_path / "out")}  # fmt: skip
    env.pop("DEVICE_STEP_RESULTS", None)
    env.pop("XLA_FLAGS", None)  # one CPU device, as the bench's CPU check runs (the suite forces 8)
    r = subprocess.run(["bash", str(REPO / "bench" / "device_step.sh"), "--results", str(tmp_path / "results")],
                       env=env, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (path,) = (tmp_path / "results").glob("*.json")
    rec = json.loads(path.read_text())
    missing = [k for k in calibrate.FIELDS if k not in rec]
    assert not missing, f"{path.name} lacks {missing}"
    for key in ("driver", "jax", "workload", "phases", "command", "device"):
        assert rec[key], key
    assert (rec["card"], rec["platform"], rec["config"], rec["new_tokens"]) == ("cpu", "cpu", "tiny", 16)
    assert rec["step_s"] > rec["bound_s"] > 0 and rec["update_mfu"] > 0
    assert rec["phases"]["update_s"] > 0 and rec["phases"]["decode_s"] > 0
    assert rec["command"] == "DEVICE_STEP_SIZES=tiny bash bench/device_step.sh"
    # the trainer's own choices, resolved for this CPU: the layer scan, xla attention in both phases
    assert rec["settings"]["decode_layers"] == "scan" and rec["settings"]["eos_check_every"] == 1
    assert rec["settings"]["attention"] == {"prefill": "xla", "update": "xla"}
    report = json.loads((tmp_path / "out" / "device_step.json").read_text())
    assert report["records"] == [str(path)]
    loaded = calibrate.load(tmp_path / "results")
    assert [x["file"] for x in loaded] == [path.name]  # read: every field there
    assert calibrate.basis(loaded) is None  # a CPU check measures no accelerator
    assert sorted(p.name for p in (REPO / "bench" / "results").iterdir()) == before


def _size(status: str = "ok", platform: str = "gpu") -> dict[str, object]:
    return {
        "size": "3b-seed", "status": status, "device": "gpu NVIDIA H200 x1", "device_kind": "NVIDIA H200",
        "platform": platform, "driver": "580.1", "jax": "0.10.2",
        "workload": {"prompts": 16, "samples": 8, "prompt_len": 512, "new_tokens": 1024, "steps": 2, "micro_batch": 8},
        "measured": {"step_s": 22.0612, "decode_mbu": 0.2312, "update_mfu": 0.26789, "cast_s": 0.1, "prefill_s": 0.2,
                     "generate_s": 8.3, "decode_s": 8.1, "host_s": 0.01, "update_s": 13.75},
        "estimate": {"step_s": 5.581, "phases_s": {"prefill": 0.1, "decode": 2.0, "update": 3.48}},
    }  # fmt: skip


def test_a_gpu_record_is_named_by_date_card_and_size_and_goes_to_bench_results(tmp_path: Path) -> None:
    noon = calendar.timegm((2026, 11, 28, 12, 0, 0))
    rec = results_record.build(_size(), config="qwen2.5-3b-v6e-8-seed", commit="abc1234", started=noon)
    assert rec is not None
    assert (
        rec["card"],
        rec["date"],
        rec["step_s"],
        rec["bound_s"],
        rec["decode_mbu"],
        rec["update_mfu"],
    ) == ("H200", "2026-11-28", 22.06, 5.581, 0.2312, 0.2679)
    assert results_record.folder(None, "gpu") == REPO / "bench" / "results"
    assert results_record.folder(None, "cpu") is None and results_record.folder(tmp_path, "cpu") == tmp_path
    first, second = results_record.write(rec, tmp_path), results_record.write(rec, tmp_path)
    assert (first.name, second.name) == ("2026-11-28-h200-3b-seed.json", "2026-11-28-h200-3b-seed-2.json")
    b = calibrate.basis(calibrate.load(tmp_path))
    assert b is not None and b.span("update_mfu") == (0.2679, 0.2679)


def test_an_unfinished_size_writes_no_record() -> None:
    assert results_record.build(_size("timeout"), config="c", commit="x", started=0.0) is None


def test_the_first_timed_step_is_tried_whatever_the_warm_up_took_and_later_ones_only_when_they_fit() -> None:
    fits = device_workload.another_step_fits
    assert fits([], now=100.0, deadline=101.0)  # the warm-up's compiles say nothing of a step's time
    step = {"step_s": 10.0, "prefill_s": 0.5}  # 1.2 x 10.5 + 5 = 17.6 s
    assert fits([step], now=100.0, deadline=117.6)
    assert not fits([step], now=100.0, deadline=117.5)


def test_a_profile_s_gpu_kernels_are_summed_by_name(tmp_path: Path) -> None:
    """`summarize_trace` (device_step's update profile, device_decode's): a perfetto trace's complete events on
    the GPU's processes summed by kernel name, largest first, with their counts and shares; host events only in
    the per-process totals."""
    import gzip

    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
        *({"ph": "X", "pid": 1, "name": "cutlass_gemm", "dur": 300.0} for _ in range(3)),
        {"ph": "X", "pid": 1, "name": "loop_fusion", "dur": 100.0},
        {"ph": "X", "pid": 2, "name": "PjitFunction", "dur": 5000.0},
        {"ph": "i", "pid": 1, "name": "marker"},
    ]
    folder = tmp_path / "plugins" / "profile" / "run"
    folder.mkdir(parents=True)
    with gzip.open(folder / "vm.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = device_workload.summarize_trace(tmp_path, tokens=2)
    assert s["device_kernel_ms"] == 1.0 and s["kernel_launches"] == 4 and s["launches_per_token"] == 2.0
    assert s["top"] == [
        {"name": "cutlass_gemm", "ms": 0.9, "count": 3, "share": 0.9},
        {"name": "loop_fusion", "ms": 0.1, "count": 1, "share": 0.1},
    ]
    assert s["processes_ms"] == {"/host:CPU": 5.0, "/device:GPU:0": 1.0}
    assert (
        "no trace file" in device_workload.summarize_trace(tmp_path / "plugins" / "none", tokens=1)["error"]
    )
