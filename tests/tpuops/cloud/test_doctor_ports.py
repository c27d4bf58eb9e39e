"""`tpuops doctor --vm` runs the run's coordinator port check on every worker of an emulated VM: the port free on
worker 0, reached from worker 1; with it filtered for worker 1, worker 1's row names the port and the rule (exit 1)."""

from __future__ import annotations

import json
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


def test_doctor_shows_the_coordinator_port_check_per_worker(
    cloud: Cloud, vm_name: str, tmp_path: Path, filters: None
) -> None:
    created = cloud.cli(
        "vm", "create", vm_name, "--type", "v4-16", "--zone", ZONE, "--runtime-version", "base"
    )
    assert created.returncode == 0, created.stderr
    (node,) = [n for n in cloud.emu.model.nodes if n.endswith(f"/nodes/{vm_name}")]
    port = free_port()
    doctor = ["doctor", "--vm", vm_name, "--zone", ZONE, "--identity", str(cloud.identity)]
    doctor += ["--set", f"coordinator_port={port}", "--lockfile", "~/l"]

    r = cloud.cli(*doctor, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    w0, w1 = json.loads(r.stdout)
    assert (w0["coordinator"], w0["coordinator_ok"]) == (f"coordinator port {port} free", True)
    assert w1["coordinator"] == f"coordinator 127.0.0.1:{port} reached (closed)" and w1["coordinator_ok"]

    address = ports.filter_port(node, 1, port)  # a firewall drops worker 1's connections to the port
    r = cloud.cli(*doctor, "--json", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    w0, w1 = json.loads(r.stdout)
    assert w0["coordinator_ok"] and not w1["coordinator_ok"]
    assert w1["coordinator"].startswith(
        f"worker 0's coordinator port {port} ({address}:{port}) cannot be reached"
    )
    assert "no answer within 5s" in w1["coordinator"] and f"--allow=tcp:{port}" in w1["coordinator"]
    people = cloud.cli(*doctor, cwd=tmp_path)
    assert (
        people.returncode == 1
        and "coordinator port" in people.stderr
        and "cannot be reached" in people.stderr
    )
