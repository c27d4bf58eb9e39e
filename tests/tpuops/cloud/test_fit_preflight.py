"""The fit preflight of `tpuops run grpo --vm`: the config compiled for the VM's TPU type before any SSH."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tpuops.checks.test_fit import too_big
from tests.tpuops.cloud.conftest import Cloud
from tests.tpuops.cloud.vms import tpuops

ZONE = "us-east1-d"


def _vm(cloud: Cloud, name: str, accelerator: str, tmp_path: Path) -> list[Path]:
    made = tpuops(cloud, ["vm", "create", name, "--type", accelerator, "--zone", ZONE, "--runtime-version", "base"],
                  tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    node = next(rec for key, rec in cloud.emu.model.nodes.items() if key.endswith(f"/nodes/{name}"))
    return [w.home for w in node.workers]


@pytest.mark.slow
def test_a_vm_whose_tpu_cannot_hold_the_config_is_refused_before_any_ssh(
    cloud: Cloud, vm_name: str, tmp_path: Path
) -> None:
    homes = _vm(cloud, vm_name, "v5litepod-1", tmp_path)
    before = [sorted(p.name for p in h.iterdir()) for h in homes]
    cfg = too_big(tmp_path)
    r = tpuops(cloud, ["run", "grpo", "--vm", vm_name, "--zone", ZONE, "--identity", str(cloud.identity),
                       "--set", f"config={cfg}", "--set", "repo_url=/nonexistent.git",
                       "--set", "branch=main", "--json"], tmp_path, timeout=900)  # fmt: skip
    assert r.returncode == 12, r.stderr[-2000:]
    data = json.loads(r.stdout)
    assert (
        data["error_class"] == "no_fit"
        and "does not fit" in data["message"]
        and "v5litepod-1" in data["message"]
    )
    assert [sorted(p.name for p in h.iterdir()) for h in homes] == before  # nothing reached the workers
    runs = Path(__import__("os").environ["TPUOPS_HOME"]) / "runs"
    assert not runs.exists() or not any(runs.iterdir())  # no run was recorded


@pytest.mark.slow
def test_the_dry_run_plan_shows_the_fit_verdict(cloud: Cloud, vm_name: str, tmp_path: Path) -> None:
    _vm(cloud, vm_name, "v4-8", tmp_path)
    # Google offers v4 in us-central2 only (the emulator's catalog starts from the shipped table): price it in the
    # emulator's zone's region, so the preflight has a billing-catalog price to use.
    cloud.emu.admin("catalog", family="v4", region="us-east1", on_demand=3.22, spot=0.9215)
    r = tpuops(cloud, ["run", "grpo", "--vm", vm_name, "--zone", ZONE, "--identity", str(cloud.identity),
                       "--set", "repo_url=/nonexistent.git", "--set", "branch=main", "--dry-run", "--json"],
               tmp_path, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    dry = json.loads(r.stdout)
    assert dry["vm"] == {"name": vm_name, "zone": ZONE, "api": "tpu", "kind": "node", "accelerator_type": "v4-8",
                         "workers": 1}  # fmt: skip
    fit = dry["fit"]
    assert " on v4-8 fits: tightest phase" in fit, fit
    # The cost of the run before it starts: the VM's region priced by the (emulated) billing catalog.
    cost = dry["estimate"]["cost"]
    assert cost["accelerator"] == "v4-8" and cost["chips"] == 4 and cost["region"] == "us-east1"
    assert cost["price"]["source"] == "catalog" and cost["price"]["where"] == cloud.url
    # Dollars come rounded to a millionth (pricing.cost): a tiny config's run costs a few hundredths of a cent.
    assert cost["steps"] > 0 and cost["per_run"]["on_demand"] == pytest.approx(
        cost["steps"] * cost["step_s"] / 3600 * 4 * cost["price"]["on_demand"], rel=1e-3, abs=5e-7
    )
    assert dry["estimate"]["peak_bytes"] > 0
    people = tpuops(cloud, ["run", "grpo", "--vm", vm_name, "--zone", ZONE, "--identity", str(cloud.identity),
                            "--set", "repo_url=/nonexistent.git", "--set", "branch=main", "--dry-run"], tmp_path)  # fmt: skip
    assert people.returncode == 0 and "/run (" in people.stderr and "Cloud Billing Catalog" in people.stderr
    skipped = tpuops(cloud, ["run", "grpo", "--vm", vm_name, "--zone", ZONE, "--identity", str(cloud.identity),
                             "--set", "repo_url=/nonexistent.git", "--set", "branch=main", "--dry-run", "--json",
                             "--skip-fit"], tmp_path)  # fmt: skip
    assert skipped.returncode == 0 and json.loads(skipped.stdout)["fit"] is None
