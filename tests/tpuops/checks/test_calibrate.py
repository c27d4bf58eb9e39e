"""The expected step at this trainer's measured efficiency: accelerator results recorded in bench/results/, read
by tpuops.checks.calibrate (the newest named first; TPU records before GPU ones; published efficiencies when asked
or when no record is there)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tpuops.checks import calibrate
from tpuops.checks.fit import step_seconds

REPO = Path(__file__).resolve().parents[3]


def _result(phases_s: dict[str, float], host_s: float = 0.5) -> dict[str, Any]:
    """The estimate part of a trainer.fit verdict (trainer/fit/analyze.py judge()) that calibration reads."""
    bound = sum(phases_s.values()) + host_s
    return {"estimate": {"step_s": bound, "bound_s": bound, "expected_s": [bound * 1.5, bound * 2.1],
                         "expected_mid_s": bound * 1.8, "host_s": host_s, "phases_s": phases_s}}  # fmt: skip


def _record(folder: Path, name: str, **fields: Any) -> None:
    base = {"card": "H100", "platform": "gpu", "date": "2026-11-27", "commit": "abc1234",
            "config": "qwen2.5-3b-v6e-8-seed", "new_tokens": 1024, "step_s": 27.0, "bound_s": 6.6,
            "decode_mbu": 0.25, "update_mfu": 0.24}  # fmt: skip
    (folder / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (folder / "bench" / "results" / f"{name}.json").write_text(json.dumps({**base, **fields}))


def test_every_recorded_result_has_every_field_the_calibration_reads() -> None:
    files = sorted((REPO / "bench" / "results").glob("*.json"))
    assert files, "bench/results/ holds the accelerator runs"
    for f in files:
        rec = json.loads(f.read_text())
        missing = [k for k in calibrate.FIELDS if k not in rec]
        assert not missing, f"{f.name} lacks {missing}"
        assert 0 < rec["decode_mbu"] < 1 and 0 < rec["update_mfu"] < 1 and rec["step_s"] > rec["bound_s"] > 0
        assert rec.get("command") or rec.get("transcribed_from"), (
            f"{f.name} says neither how it was measured nor where from"
        )
    assert len(calibrate.load(REPO / "bench" / "results")) == len(files)


def test_the_repositorys_gpu_runs_give_the_range_and_name_the_newest_first() -> None:
    b = calibrate.basis(calibrate.load(REPO / "bench" / "results"))
    assert b is not None and b.records[0]["card"] == "H200"
    assert b.words() == "H200 2026-11-28, H100 2026-11-27: decode 23-25% of HBM bandwidth, update 24-27% MFU"


def test_calibration_divides_each_phase_bound_by_its_measured_efficiency(tmp_path: Path) -> None:
    _record(tmp_path, "h100", decode_mbu=0.25, update_mfu=0.24)
    _record(tmp_path, "h200", card="H200", date="2026-11-28", decode_mbu=0.20, update_mfu=0.30)
    phases = {"decode_cast": 0.05, "prefill": 0.2, "decode": 2.0, "update": 3.0}
    out = calibrate.calibrate(_result(phases), cwd=tmp_path / "bench")  # found from inside the checkout too
    cal = out["estimate"]["calibrated"]
    low = 0.5 + (0.05 + 2.0) / 0.25 + (0.2 + 3.0) / 0.30
    high = 0.5 + (0.05 + 2.0) / 0.20 + (0.2 + 3.0) / 0.24
    assert cal["expected_s"] == pytest.approx([low, high]) and cal["expected_mid_s"] == pytest.approx(
        (low + high) / 2
    )
    assert [r["card"] for r in cal["basis"]["records"]] == ["H200", "H100"]
    assert cal["basis"]["decode_mbu"] == [0.20, 0.25] and cal["basis"]["update_mfu"] == [0.24, 0.30]
    line = out["estimate"]["basis_line"]
    assert line.startswith(
        f"expected {low:.2f}-{high:.2f} s at this trainer's measured efficiency (H200 2026-11-28, "
    )
    assert "decode 20-25% of HBM bandwidth, update 24-30% MFU)" in line
    assert line.endswith(
        f"; {5.75 * 1.5:.2f}-{5.75 * 2.1:.2f} s at published efficiencies"
    )  # the verdict's own
    assert step_seconds(out) == (pytest.approx((low + high) / 2), "calibrated_mid_s")  # the cost's step


def test_a_tpu_record_beats_the_gpu_ones_even_when_older(tmp_path: Path) -> None:
    _record(tmp_path, "h200", card="H200", date="2026-11-28", decode_mbu=0.23, update_mfu=0.27)
    _record(
        tmp_path, "v6e", card="v6e-8", platform="tpu", date="2026-11-20", decode_mbu=0.55, update_mfu=0.45
    )
    out = calibrate.calibrate(_result({"decode": 1.0, "update": 1.0}, host_s=0.0), cwd=tmp_path)
    assert out["estimate"]["calibrated"]["expected_s"] == pytest.approx([1 / 0.55 + 1 / 0.45] * 2)
    assert "(v6e-8 2026-11-20: decode 55% of HBM bandwidth, update 45% MFU)" in out["estimate"]["basis_line"]


def test_published_when_asked_or_when_no_results_are_recorded(tmp_path: Path) -> None:
    _record(tmp_path / "repo", "h100")
    asked = calibrate.calibrate(_result({"update": 1.0}), "published", cwd=tmp_path / "repo")
    assert asked["estimate"]["calibrated"] is None
    assert (
        asked["estimate"]["basis_line"]
        == "expected 2.25-3.15 s at published efficiencies (--efficiency published)"
    )
    assert step_seconds(asked) == (pytest.approx(2.7), "expected_mid_s")
    bare = (
        tmp_path / "wheel-install"
    )  # no bench/results/ anywhere above: no crash, the published range, said so
    bare.mkdir()
    none = calibrate.calibrate(_result({"update": 1.0}), cwd=bare, packaged=False)
    assert (
        none["estimate"]["calibrated"] is None
        and "no accelerator results recorded here" in none["estimate"]["basis_line"]
    )
    _record(tmp_path / "broken", "partial")
    (tmp_path / "broken" / "bench" / "results" / "partial.json").write_text('{"card": "H100"}')
    assert (
        calibrate.load(tmp_path / "broken" / "bench" / "results") == []
    )  # a record without every field is left out


def test_the_shipped_records_are_the_checkout_s_and_calibrate_an_install_without_a_checkout(
    tmp_path: Path,
) -> None:
    """A wheel has no bench/: the package's copy of the records (package data) is the basis there, and it is the
    checkout's `bench/results/` file for file (copy a new record into tpuops/checks/data/results/ too)."""
    shipped = calibrate.shipped()
    assert shipped is not None
    ours = {f.name: f.read_bytes() for f in (REPO / "bench" / "results").glob("*.json")}
    assert {f.name: f.read_bytes() for f in shipped.glob("*.json")} == ours
    away = tmp_path / "elsewhere"
    away.mkdir()
    out = calibrate.calibrate(_result({"decode": 1.0, "update": 1.0}), cwd=away)
    assert (
        out["estimate"]["calibrated"] is not None and "measured efficiency" in out["estimate"]["basis_line"]
    )
