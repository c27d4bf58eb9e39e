"""Every chip during a run: the step line's HBM and duty-cycle fields (process 0) and other processes' `chips:`
lines, per worker over time in `tpuops report --json` and its HTML page (as headless Chromium reads it), and
the run against its fit (estimated and actual cost, measured peak HBM beside the predicted one)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.tpuops.run.test_logreport import CHROMIUM_FLAGS, chromium, figures, full_step_line, tpuops


def chip_step(i: int, dt: float) -> str:
    hbm = [20.0 + i * 0.1, 21.0 + i * 0.1]
    return (f"{full_step_line(i, dt, reward=0.1)} completion_len_mean=12.0 hbm_gb_min={min(hbm):.2f} "
            f"hbm_gb_max={max(hbm):.2f} hbm_gb_peak={max(hbm) + 1:.2f} hbm_gb_limit=31.25 duty_pct_min={60 + i:.1f} "
            f"duty_pct_max={70 + i:.1f} hbm_gb_chips={hbm[0]:.2f}/{hbm[1]:.2f} "
            f"duty_pct_chips={60 + i:.1f}/{70 + i:.1f}")  # fmt: skip


def chips_line(i: int, process: int) -> str:
    return (f"chips: step={i} process={process} hbm_gb_min={18 + i:.2f} hbm_gb_max={19 + i:.2f} "
            f"hbm_gb_limit=31.25 duty_pct_min=50.0 duty_pct_max=55.0 hbm_gb_chips={18 + i:.2f}/{19 + i:.2f} "
            "duty_pct_chips=50.0/55.0")  # fmt: skip


def make_run(home: Path, name: str, predicted_gb: float) -> Path:
    """A 2-worker run as tpuops leaves it: logs, exit files, run.json and the fit estimate in result.json."""
    run = home / "runs" / name
    run.mkdir(parents=True)
    (run / "worker-0.log").write_text(
        "\n".join(chip_step(i, 5.0 if i == 0 else 2.0) for i in range(6)) + "\n"
    )
    (run / "worker-1.log").write_text("\n".join(chips_line(i, 1) for i in range(6)) + "\n")
    for w in (0, 1):
        (run / f"worker-{w}.exit").write_text("0\n")
    price = {"family": "v6e", "region": "us-east5", "on_demand": 2.7, "spot": 0.81, "source": "table",
             "where": "https://cloud.google.com/tpu/pricing", "date": "2025-06-01", "age_days": 1,
             "unit": "USD per chip-hour"}  # fmt: skip
    cost = {"accelerator": "v6e-8", "chips": 8, "region": "us-east5", "step_s": 1.5, "step_basis": "expected_mid_s",
            "steps": 6, "per_step": {"on_demand": 0.009, "spot": 0.0027},
            "per_run": {"on_demand": 0.054, "spot": 0.0162}, "price": price}  # fmt: skip
    estimate = {"config": "qwen2.5-3b-v6e-8", "accelerator": "v6e-8", "cost": cost,
                "peak_bytes": predicted_gb * 1e9, "tightest_phase": "update"}  # fmt: skip
    record = {"run_id": name, "sop": "grpo", "workers": [0, 1], "values": {}, "estimate": estimate,
              "target": {"hosts": ["me@10.0.0.2:22", "me@10.0.0.3:22"]}, "started": 0.0}  # fmt: skip
    (run / "run.json").write_text(json.dumps(record))
    (run / "result.json").write_text(json.dumps({"ok": True, "exit_code": 0, "estimate": estimate}))
    return run


def test_json_has_each_workers_chips_over_time_and_the_run_against_its_fit(
    tpuops_home: Path, tmp_path: Path
) -> None:
    make_run(tpuops_home, "20261126-chips-a", predicted_gb=20.0)
    r = tpuops("report", "20261126-chips-a", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rep = out["report"]
    assert set(rep["chips"]) == {"0", "1"}
    assert [s["step"] for s in rep["chips"]["0"]] == list(range(6)) == [s["step"] for s in rep["chips"]["1"]]
    assert (
        rep["chips"]["0"][-1]["hbm_gb_chips"] == [20.5, 21.5]
        and rep["chips"]["0"][-1]["duty_pct_max"] == 75.0
    )
    assert rep["chips"]["1"][-1] == {"step": 5, "hbm_gb_min": 23.0, "hbm_gb_max": 24.0, "hbm_gb_limit": 31.25,
                                     "duty_pct_min": 50.0, "duty_pct_max": 55.0, "hbm_gb_chips": [23.0, 24.0],
                                     "duty_pct_chips": [50.0, 55.0]}  # fmt: skip
    assert rep["rows"][3]["hbm_gb_max"] == 21.3 and rep["rows"][3]["duty_pct_min"] == 63.0
    assert rep["hbm_peak_gb"] == 24.0  # worker 1's chip held the most
    against = out["against_fit"]
    actual = against["cost"]["actual"]
    assert actual["steps"] == 6 and actual["step_s"] == 2.0
    assert actual["on_demand"] == pytest.approx(6 * 2.0 / 3600 * 8 * 2.7, abs=1e-6)
    assert against["cost"]["estimated"]["on_demand"] == 0.054
    assert against["hbm"] == {"predicted_gb": 20.0, "measured_gb": 24.0, "over": True, "phase": "update"}
    assert "more than the fit predicted (20.00 GB, update)" in against["warnings"][0]
    text = tpuops("report", "20261126-chips-a", cwd=tmp_path).stderr
    assert "chips w1 at step 5: HBM 23.00-24.00 GB, duty 50-55% over 6 samples" in text
    assert "cost: estimated $0.0540 on demand" in text and "HBM: measured peak 24.00 GB" in text
    assert "warning" in text and "MORE than predicted" in text
    # A detached run has no result.json yet: the estimate its run.json kept is used.
    (tpuops_home / "runs" / "20261126-chips-a" / "result.json").unlink()
    detached = json.loads(tpuops("report", "20261126-chips-a", "--json", cwd=tmp_path).stdout)
    assert (
        detached["against_fit"]["hbm"]["over"] is True
        and detached["against_fit"]["cost"]["actual"]["steps"] == 6
    )


def test_old_logs_and_cpu_runs_have_no_chip_fields_and_the_report_says_so(tmp_path: Path) -> None:
    log = tmp_path / "cpu.log"
    log.write_text("\n".join(full_step_line(i, 1.0, reward=0.1) for i in range(3)) + "\n")
    r = tpuops("report", str(log), "--json", cwd=tmp_path)
    rep = json.loads(r.stdout)["report"]
    assert r.returncode == 0 and rep["chips"] == {} and rep["hbm_peak_gb"] is None
    assert rep["rows"][0]["hbm_gb_max"] is None and rep["rows"][0]["duty_pct_chips"] is None
    assert json.loads(r.stdout)["against_fit"] == {"cost": None, "hbm": None, "warnings": []}
    page = tmp_path / "cpu.html"
    assert tpuops("report", str(log), "--html", str(page), cwd=tmp_path).returncode == 0
    assert "no HBM or duty-cycle fields in the log (a CPU backend exposes none" in page.read_text()


@pytest.mark.slow
def test_the_html_page_plots_each_workers_chips_in_headless_chromium(
    tpuops_home: Path, tmp_path: Path
) -> None:
    exe = chromium()
    make_run(tpuops_home, "20261126-chips-b", predicted_gb=30.0)
    page = tmp_path / "chips.html"
    r = tpuops("report", "20261126-chips-b", "--html", str(page), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    dom = subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=90, check=True,
    ).stdout  # fmt: skip
    charts = figures(dom)
    assert charts["hbm"]["legend"] == ["w0 max", "w0 min", "w1 max", "w1 min"]
    assert charts["hbm"]["ylim"] == [0.0, 31.25]  # up to the chips' HBM
    assert all(n == 6 for n in charts["hbm"]["lines"].values()) and len(charts["hbm"]["lines"]) == 4
    assert charts["duty"]["ylim"] == [0.0, 100.0] and len(charts["duty"]["lines"]) == 4
    assert "Against the fit" in dom and "HBM: measured peak 24.00 GB per chip, fit predicted 30.00 GB" in dom
    assert "MORE than predicted" not in dom
    table = re.search(r'<table class="chips">(.*?)</table>', dom, re.S)
    assert table is not None
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", table[1], re.S)]
    assert [r for r in rows if r] == [["w0", "5", "0", "20.5", "65"], ["w0", "5", "1", "21.5", "75"],
                                      ["w1", "5", "0", "23", "50"], ["w1", "5", "1", "24", "55"]]  # fmt: skip
