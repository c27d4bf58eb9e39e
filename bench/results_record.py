"""One bench/device_step.py size as a results record: the JSON object `tpuops fit`'s calibration reads
(tpuops/checks/calibrate.py FIELDS), written one file a run into bench/results/ (or a folder given).

An accelerator run (platform gpu or tpu) is written to bench/results/ unless another folder is given; a CPU run
(`DEVICE_STEP_SIZES=tiny`, a check of the script) only into a folder given explicitly, so a check never lands
among the measurements (the calibration reads GPU and TPU records only).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import NotRequired

from tpuops.checks.calibrate import Measured

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PHASES = ("cast_s", "prefill_s", "generate_s", "decode_s", "host_s", "update_s")
SETTINGS = ("remat", "attention", "decode_layers", "eos_check_every", "sets", "xla_flags")


class Record(Measured):
    """One run of one size: the fields the calibration reads (`Measured`), then the run's own."""

    device: str
    driver: str
    jax: str
    size: str
    workload: dict[str, int]
    phases: dict[str, float]
    bound_phases: dict[str, float]
    settings: dict[str, object]  # the trainer's choices the run resolved (remat, attention, decode loop, ...)
    command: str
    update_profile: NotRequired[dict[str, object]]  # DEVICE_STEP_PROFILE=update: the update's kernels by name


def card_name(device_kind: str, platform: str) -> str:
    """`NVIDIA H200 141GB` -> `H200`, `NVIDIA H100 80GB HBM3` -> `H100`, `TPU v6 lite` -> `TPU v6 lite`, a CPU
    `cpu`."""
    if platform == "cpu":
        return "cpu"
    m = re.search(r"\b([A-Z]\d{2,3}[A-Za-z]*)\b", device_kind)
    return m[1] if m and platform == "gpu" else device_kind


def driver_version(platform: str) -> str:
    """The NVIDIA driver (nvidia-smi) on a GPU; `none` elsewhere or when it cannot be read."""
    smi = shutil.which("nvidia-smi")
    if platform != "gpu" or smi is None:
        return "none"
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "none"
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "none"


def command(size: str) -> str:
    """The command that reproduces the run: its DEVICE_STEP_* settings and the script."""
    env = {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith("DEVICE_STEP_") and k != "DEVICE_STEP_SIZES"
    }
    return " ".join(
        [f"DEVICE_STEP_SIZES={size}", *(f"{k}={v}" for k, v in env.items()), "bash bench/device_step.sh"]
    )


def _sig(x: object) -> float:
    """Four significant digits (a CPU check's tiny figures stay non-zero)."""
    if not isinstance(x, int | float):
        raise TypeError(f"a figure of the run is not a number: {x!r}")
    return float(f"{x:.4g}")


def build(size_result: dict[str, object], *, config: str, commit: str, started: float) -> Record | None:
    """The record of one size's result (bench/device_step.py `measure`), None unless it finished ("ok")."""
    if size_result.get("status") != "ok":
        return None
    measured = size_result["measured"]
    estimate = size_result["estimate"]
    workload = size_result["workload"]
    assert isinstance(measured, dict) and isinstance(estimate, dict) and isinstance(workload, dict)
    platform = str(size_result.get("platform", "gpu"))
    kind = str(size_result.get("device_kind", size_result.get("device", "")))
    rec = Record(
        card=card_name(kind, platform), platform=platform, date=time.strftime("%Y-%m-%d", time.gmtime(started)),
        commit=commit, config=config, new_tokens=int(workload["new_tokens"]), step_s=_sig(measured["step_s"]),
        bound_s=_sig(estimate["step_s"]), decode_mbu=_sig(measured["decode_mbu"] or 0.0),
        update_mfu=_sig(measured["update_mfu"]), device=str(size_result.get("device", "")),
        driver=str(size_result.get("driver", "none")), jax=str(size_result.get("jax", "")), size=str(size_result["size"]),
        workload={k: int(v) for k, v in workload.items()},
        phases={k: _sig(measured[k]) for k in PHASES if k in measured},
        bound_phases={k: _sig(v) for k, v in estimate["phases_s"].items()},
        settings={k: size_result[k] for k in SETTINGS if size_result.get(k) not in (None, "")},
        command=command(str(size_result["size"])),
    )  # fmt: skip
    if isinstance(profile := size_result.get("update_profile"), dict):
        rec["update_profile"] = profile
    return rec


def folder(given: Path | None, platform: str) -> Path | None:
    """Where a record goes: the folder given, else bench/results/ for an accelerator run, else nowhere."""
    if given is not None:
        return given
    return RESULTS if platform in ("gpu", "tpu") else None


def write(rec: Record, where: Path) -> Path:
    """`DATE-CARD-SIZE.json` in `where` (a second run of the day gets -2, -3, ...)."""
    import json

    where.mkdir(parents=True, exist_ok=True)
    stem = f"{rec['date']}-{rec['card'].lower().replace(' ', '-')}-{rec['size']}"
    path, n = where / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = where / f"{stem}-{n}.json"
    path.write_text(json.dumps(rec, indent=2) + "\n")
    return path
