"""`tpuops fit`'s cost and estimate on a real compile: the tiny preset compiled for v6e-8 through libtpu (no TPU),
then asked again from the cache for other regions, another efficiency basis, a billing endpoint and other terminal
widths. One compile for the whole file (~1-2 minutes of CPU): every later `tpuops fit` reads the cached verdict."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpuops.cloud import price_table
from tpuops.cloud.emulator.server import Emulator

pytest.importorskip("libtpu", reason="libtpu (the tpu extra) compiles for a TPU on this machine")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
ARGS = ("tiny", "--accelerator", "v6e-8", "--set", "train.micro_batch=8", "--set", "train.prompts_per_step=4")
NO_CREDENTIALS = {"GOOGLE_APPLICATION_CREDENTIALS": "", "TPUOPS_BILLING_API": ""}


def _fit(*args: str, home: Path, columns: int = 250, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuops", "fit", *ARGS, *args], capture_output=True, text=True, check=False, cwd=REPO,
        env={**os.environ, "COLUMNS": str(columns), "TPUOPS_HOME": str(home), "CLOUDSDK_CONFIG": str(home / "gcloud"),
             **NO_CREDENTIALS, **env}, stdin=subprocess.DEVNULL, timeout=900,
    )  # fmt: skip


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state home holding tiny's compiled verdict for v6e-8 (the one compile of this file)."""
    h = tmp_path_factory.mktemp("fit-home")
    r = _fit("--json", "--region", "asia-northeast1", home=h)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["cached"] is False
    return h


def _json(r: subprocess.CompletedProcess[str]) -> dict:
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_each_region_is_priced_from_the_catalog_at_the_calibrated_step(home: Path) -> None:
    src = price_table.source()
    for region, per_chip in (("asia-northeast1", 3.24), ("europe-west4", 2.97), ("us-central1", 2.7)):
        out = _json(_fit("--json", "--region", region, home=home))
        c, cal = out["cost"], out["estimate"]["calibrated"]
        assert out["cached"] is True and c["region"] == region and c["chips"] == 8
        assert c["price"]["on_demand"] == per_chip and c["price"]["source"] == "table"
        assert c["price"]["catalog"] == src and c["price"]["commit"] == src["commit"]
        assert c["step_basis"] == "calibrated_mid_s" and c["step_s"] == cal["expected_mid_s"]
        assert c["per_step"]["on_demand"] == round(cal["expected_mid_s"] / 3600 * 8 * per_chip, 6)
        # The calibrated range beside the published one, with its basis (card, date, measured efficiencies).
        assert (
            out["estimate"]["expected_s"] != cal["expected_s"]
            and cal["expected_s"][0] > out["estimate"]["bound_s"]
        )
        assert cal["basis"]["records"][0]["card"] == "H200" and cal["basis"]["decode_mbu"] == [0.23, 0.25]
    spot = {r: _json(_fit("--json", "--region", r, home=home))["cost"]["price"]["spot"]
            for r in ("us-central1", "us-east5")}  # fmt: skip
    assert spot == {"us-central1": round(5.18666 / 8, 6), "us-east5": 1.08}  # same on-demand, its own Spot


def test_a_region_without_the_type_prints_no_price_and_the_nearest_that_offer_it(home: Path) -> None:
    r = _fit("--json", "--region", "southamerica-east1-c", home=home)  # a zone: read as its region
    out = _json(r)
    assert out["cost"] is None
    u = out["unpriced"]
    assert u["region"] == "southamerica-east1" and u["reason"].startswith(
        "v6e-8 is not offered in southamerica-east1"
    )
    assert u["source"]["commit"] == price_table.source()["commit"] and len(u["nearest"]) == 3
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("cost:"))
    assert "not offered in southamerica-east1" in line and "nearest regions that offer it: us-east" in line
    assert "$" not in line.split(";")[0]  # no price under southamerica-east1's name


def test_published_efficiencies_when_asked_and_the_billing_catalog_when_given(
    home: Path, tmp_path: Path
) -> None:
    pub = _json(_fit("--json", "--efficiency", "published", home=home))
    assert pub["estimate"]["calibrated"] is None and pub["cost"]["step_basis"] == "expected_mid_s"
    assert pub["cost"]["step_s"] == pub["estimate"]["expected_mid_s"]
    emu = Emulator(tmp_path / "emu", zones=["europe-west4-a"])
    emu.start()
    try:
        emu.admin("catalog", family="v6e", region="europe-west4", on_demand=3.0, spot=1.5)
        r = _fit("--json", "--region", "europe-west4", "--billing-endpoint", emu.url, home=home)
        c = _json(r)["cost"]
        assert c["price"]["source"] == "catalog" and (c["price"]["on_demand"], c["price"]["spot"]) == (
            3.0,
            1.5,
        )
        assert "Cloud Billing Catalog" in r.stderr
    finally:
        emu.stop()


@pytest.mark.parametrize("columns", [80, 100, 200])
def test_the_table_shows_every_number_whole_at_any_width(home: Path, columns: int) -> None:
    r = _fit(home=home, columns=columns)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "…" not in r.stderr
    words = set(re.findall(r"\S+", r.stderr))
    out = _json(_fit("--json", home=home))
    for name, p in out["phases"].items():  # each phase's figures, as the table prints them, stand whole
        for figure in (name, f"{p['peak_bytes'] / 1e9:.2f}", f"{p['flops'] / 1e12:.2f}", f"{p['seconds']:.3f}",
                       "-".join(f"{s:.2f}" for s in p["expected_s"])):  # fmt: skip
            assert figure in words, (columns, figure)
    assert ("memory per device (GB)" in r.stderr) == (columns < 200)  # two tables below the one-table width
    assert "at this trainer's measured efficiency (H200 2026-11-28" in r.stderr
