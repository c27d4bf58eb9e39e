"""Multi-host preflight on an emulated VM: worker 0's coordinator port, filtered for worker 1 (a firewall that drops
it), refuses the run before anything starts (exit 3, naming the port and the worker)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud.emulator import ports
from tpuops.cloud.emulator.sshd import free_port

ZONE = "us-east1-d"


@pytest.fixture
def filters() -> Iterator[None]:
    yield
    ports.clear()


@pytest.mark.slow
def test_a_coordinator_port_worker_1_cannot_reach_refuses_the_run_before_it_starts(
    cloud: Cloud, vm_name: str, worker_python: str, committed_repo: Path, tmp_path: Path, filters: None
) -> None:
    created = cloud.cli(
        "vm", "create", vm_name, "--type", "v4-16", "--zone", ZONE, "--runtime-version", "base"
    )
    assert created.returncode == 0, created.stderr
    (node,) = [n for n in cloud.emu.model.nodes if n.endswith(f"/nodes/{vm_name}")]
    port = free_port()
    ports.filter_port(node, 1, port)
    head = subprocess.run(
        ["git", "-C", str(committed_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    args = ["run", "grpo", "--vm", vm_name, "--zone", ZONE, "--identity", str(cloud.identity), "--skip-fit"]
    sets = {
        "repo_url": str(committed_repo), "branch": head, "venv": "none", "python": worker_python,
        "lockfile": "~/libtpu_lockfile", "coordinator_port": str(port), "steps": "1",
    }  # fmt: skip
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    r = cloud.cli(*args, "--json", cwd=tmp_path, timeout=300)
    assert r.returncode == 3, r.stderr[-3000:]
    data = json.loads(r.stdout)
    assert data["error_class"] == "connect"
    (checks,) = [s for s in data["steps"] if s["kind"] == "checks"]
    w1 = checks["workers"]["1"]
    assert w1["status"] == "failed" and f"coordinator port {port} " in w1["detail"], w1
    assert "no answer within 5s" in w1["detail"] and f"--allow=tcp:{port}" in w1["detail"]
    assert checks["workers"]["0"]["status"] == "ok"
    assert all(s["kind"] == "checks" for s in data["steps"])  # nothing ran after the checks
    people = cloud.cli(*args, cwd=tmp_path, timeout=300)
    assert people.returncode == 3 and f"coordinator port {port} " in people.stderr and "w1" in people.stderr
    # With the port open again, the same check passes (worker 1 reaches it: refused, since nothing listens yet).
    ports.clear(node)
    ok = cloud.cli(*args, "--json", "--set", "steps=1", "--dry-run", cwd=tmp_path, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
