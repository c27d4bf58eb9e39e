"""Cost before a run: TPU prices from the Cloud Billing Catalog (the real google-cloud-billing client against the
emulator's catalog routes) or the shipped table, and `tpuops fit --json`'s `cost` object (from a cached verdict:
no compile)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuops.checks import fit as fitlib
from tpuops.cloud import pricing
from tpuops.cloud.emulator.server import Emulator

pytest.importorskip(
    "google.cloud.billing_v1", reason="google-cloud-billing (a declared dependency) is not installed"
)

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Emulator]:
    emu = Emulator(tmp_path / "emu", zones=["us-east5-a"])
    emu.start()
    yield emu
    emu.stop()


def test_the_real_client_reads_tpu_prices_from_the_emulated_catalog(
    catalog: Emulator, no_credentials: None
) -> None:
    catalog.admin("catalog", family="v6e", region="us-east5", on_demand=2.97, spot=1.13)
    price = pricing.lookup("v6e-8", "us-east5-b", catalog.url)  # a zone is read as its region
    assert price is not None and price.source == "catalog" and price.where == catalog.url
    assert (price.family, price.region, price.on_demand, price.spot, price.age_days) == (
        "v6e",
        "us-east5",
        2.97,
        1.13,
        0,
    )
    calls = [r.line for r in catalog.model.requests]
    assert (
        calls[0] == "GET /v1/services" and calls.count("GET /v1/services/6F81-5844-456A/skus") >= 2
    )  # paged
    # Cached with its date: a second lookup asks nothing; commitments and CPU SKUs were left out.
    n = len(catalog.model.requests)
    again = pricing.lookup("v5litepod-8", "asia-northeast1", catalog.url)
    assert (
        again is not None
        and again.source == "catalog"
        and again.on_demand == pricing.table()["families"]["v5e"]["on_demand"]
    )
    assert len(catalog.model.requests) == n
    cached = json.loads(next((Path(os.environ["TPUOPS_HOME"]) / "prices").glob("catalog-*.json")).read_text())
    assert set(cached["prices"]) == {"v4", "v5e", "v5p", "v6e"} and cached["date"] == price.date
    assert cached["prices"]["v6e"]["us-east5"] == {"on_demand": 2.97, "spot": 1.13}
    # A region the catalog does not price: the shipped table, which says so.
    assert pricing.lookup("v6e-8", "southamerica-east1", catalog.url).source == "table"  # type: ignore[union-attr]


def test_without_credentials_or_a_reachable_catalog_the_shipped_table_is_used(no_credentials: None) -> None:
    table = pricing.table()
    assert table["source"].startswith("https://cloud.google.com/") and table["date"]
    price = pricing.lookup("v5p-8", None)
    assert price is not None and price.source == "table" and price.region == pricing.DEFAULT_REGION
    assert price.on_demand == table["families"]["v5p"]["on_demand"] and price.date == table["date"]
    assert price.age_days > 0
    with socket.socket() as s:  # a port nothing listens on: the catalog cannot answer
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert pricing.lookup("v6e-8", "us-east5", closed).source == "table"  # type: ignore[union-attr]
    assert pricing.lookup("tpu7x-8", "us-east5") is None  # no price known: no cost rather than a wrong one


def test_cost_is_step_time_times_chips_times_the_price_per_chip_hour() -> None:
    price = pricing.Price("v4", "us-central2", 3.22, 0.97, "table", "x", "2025-06-01", 1)
    c = pricing.cost(4.5, 100, "v4-16", price, "expected_mid_s")  # v4-16: 16 TensorCores = 8 chips
    assert c["chips"] == 8
    assert c["per_step"]["on_demand"] == pytest.approx(4.5 / 3600 * 8 * 3.22, abs=1e-6)
    assert c["per_run"]["spot"] == pytest.approx(100 * 4.5 / 3600 * 8 * 0.97, abs=1e-6)
    assert pricing.cost(4.5, None, "v4-16", price, "bound_s")["per_run"] is None
    assert [pricing.dollars(x) for x in (1234.5, 0.05625, 0.00002, None)] == [
        "$1,234.50",
        "$0.0563",
        "<$0.0001",
        "-",
    ]


def _cached_verdict(home: Path, config: str, accelerator: str, steps: int) -> None:
    """A fit verdict in the cache as trainer.fit writes it (so `tpuops fit` compiles nothing)."""
    phase = {
        "argument_bytes": 2e9, "output_bytes": 1e9, "temp_bytes": 3e9, "resident_bytes": 4e9, "peak_bytes": 10e9,
        "fits": True, "headroom": 0.7, "flops": 1e13, "hbm_bytes": 5e9, "bytes_accessed": 6e9,
        "collective_bytes": {"moved": 1e8}, "seconds": 1.0, "expected_s": [1.5, 2.0], "largest_term": "hbm",
    }  # fmt: skip
    result = {
        "config": config, "accelerator": accelerator, "topology": "v6e:2x4", "devices": 8, "device_kind": "TPU v6e",
        "hbm_bytes_per_device": 32 * 2**30, "usable_bytes_per_device": 0.9 * 32 * 2**30, "impl": "chunked",
        "mesh": "fsdp:8", "rollout_mesh": "dp:4,tp:2", "method": "compiled", "steps": steps,
        "phases": {"update": phase}, "fits": True, "headroom": 0.7, "tightest_phase": "update", "fix": None,
        "estimate": {"step_s": 3.0, "bound_s": 3.0, "expected_s": [4.0, 6.0], "expected_mid_s": 5.0, "host_s": 0.1,
                     "largest_phase": "update", "efficiency": {}},
    }  # fmt: skip
    key = fitlib.cache_key(config, [], f"accelerator={accelerator}", REPO)
    (home / "fit").mkdir(parents=True, exist_ok=True)
    (home / "fit" / f"{key}.json").write_text(json.dumps(result))


def _fit(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuops", "fit", *args], capture_output=True, text=True, check=False, cwd=REPO,
        env={**os.environ, "COLUMNS": "250", **env}, stdin=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip


def test_tpuops_fit_json_has_a_cost_object_from_the_catalog_or_the_table(
    catalog: Emulator, tmp_path: Path
) -> None:
    home = Path(os.environ["TPUOPS_HOME"])
    _cached_verdict(home, "qwen2.5-3b-v6e-8", "v6e-8", 200)
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "no-gcloud"), "GOOGLE_APPLICATION_CREDENTIALS": ""}
    catalog.admin("catalog", family="v6e", region="europe-west4", on_demand=3.0, spot=1.5)
    r = _fit("qwen2.5-3b-v6e-8", "--accelerator", "v6e-8", "--json", "--region", "europe-west4",
             "--billing-endpoint", catalog.url, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    c = out["cost"]
    assert (
        out["cached"] is True
        and c["steps"] == 200
        and c["step_basis"] == "expected_mid_s"
        and c["chips"] == 8
    )
    assert c["price"]["source"] == "catalog" and c["price"]["date"] and c["price"]["age_days"] == 0
    assert c["per_step"] == {
        "on_demand": round(5.0 / 3600 * 8 * 3.0, 6),
        "spot": round(5.0 / 3600 * 8 * 1.5, 6),
    }
    assert c["per_run"]["on_demand"] == pytest.approx(200 * 5.0 / 3600 * 8 * 3.0, abs=1e-5)
    assert "cost: $0.0333/step, $6.67/run (200 steps) on demand; Spot $0.0167/step, $3.33/run" in r.stderr
    assert "Cloud Billing Catalog" in r.stderr
    # No catalog (no credentials, no endpoint): the shipped table, its page and its age in the line.
    table = _fit("qwen2.5-3b-v6e-8", "--accelerator", "v6e-8", "--json", env=env)
    assert table.returncode == 0, table.stderr[-2000:]
    t = json.loads(table.stdout)["cost"]
    assert t["price"]["source"] == "table" and t["region"] == "us-central1"
    assert t["price"]["where"] == "https://cloud.google.com/tpu/pricing" and t["price"]["age_days"] > 0
    assert f"shipped table (cloud.google.com/tpu/pricing, {t['price']['date']}" in table.stderr
