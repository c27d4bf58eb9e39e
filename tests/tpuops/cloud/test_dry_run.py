"""A dry run changes nothing, anywhere: on an emulated 2-worker VM with real sshd workers, a key the VM does not
know yet is not pushed (the metadata read back is as it was), the workers are not read with it, and the run says
what it would do; once the key is there, the same dry run reads the workers (read-only)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud.client import connect
from tpuops.cloud.create import CreateRequest, create_vm
from tpuops.cloud.emulator.sshd import client_keypair
from tpuops.cloud.keys import ensure_identity
from tpuops.cloud.locate import NOT_READ
from tpuops.cloud.tpu_api import get_vm

ZONE = "us-east1-d"


def _writes(cloud: Cloud, since: int) -> list[str]:
    """The emulator's requests since `since` that may change something (reads: GET, and getGuestAttributes)."""
    return [c for c in cloud.calls(since) if not (c.startswith("GET ") or c.endswith(":getGuestAttributes"))]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of this test's own, with the google_compute_engine key a gcloud user has (not on the VM yet)."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    ensure_identity(None, lambda _: None)
    return h


def test_a_dry_run_pushes_no_key_and_reads_the_workers_once_the_key_is_there(
    cloud: Cloud, vm_name: str, home: Path, tmp_path: Path, committed_repo: Path
) -> None:
    _, alice = client_keypair(tmp_path / "alice")
    api = connect("proj-dry", cloud.url, cloud.notes.append)
    create_vm(api, CreateRequest(vm_name, "v4-16", "tpu-ubuntu2204-base", (ZONE,), ssh_keys=f"alice:{alice}"))
    before = get_vm(api, ZONE, vm_name).metadata
    target = ["--vm", vm_name, "--zone", ZONE, "--project", "proj-dry"]
    sync = ["sop", "run", "sync", *target, "--set", f"repo_url={committed_repo}", "--set", "branch=HEAD"]
    n = len(cloud.emu.model.requests)
    r = cloud.cli(*sync, "--dry-run", "--json", env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert "would add your key to the VM's ssh-keys metadata" in r.stderr
    assert get_vm(api, ZONE, vm_name).metadata == before  # read back from the emulator: as it was
    assert not _writes(cloud, n), cloud.calls(n)  # only reads
    plan = json.loads(r.stdout)
    assert {p["worker"] for p in plan["preview"]} == {0, 1}
    assert {p["error"] for p in plan["preview"]} == {NOT_READ}  # not read: its key is not there
    assert not list((Path(os.environ["TPUOPS_HOME"]) / "runs").glob("*/run.json"))  # no run recorded

    # A run adds the key; a dry run now reads both workers, and still changes nothing.
    assert cloud.cli("run", "exec", *target, "--set", "cmd=true", env={"HOME": str(home)}).returncode == 0
    after = get_vm(api, ZONE, vm_name).metadata
    assert after["ssh-keys"].startswith(f"alice:{alice}\n")
    n = len(cloud.emu.model.requests)
    r = cloud.cli(*sync, "--dry-run", "--json", env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert "would add" not in r.stderr and "nothing to add" not in r.stderr  # a routine confirmation: -v only
    r = cloud.cli(*sync, "--dry-run", "--json", "-v", env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert "would add" not in r.stderr and "is in the VM's ssh-keys; nothing to add" in r.stderr
    assert [p["error"] for p in json.loads(r.stdout)["preview"]] == [None, None]
    assert get_vm(api, ZONE, vm_name).metadata == after
    assert not _writes(cloud, n)
    for w in cloud.emu.model.nodes[f"projects/proj-dry/locations/{ZONE}/nodes/{vm_name}"].workers:
        assert not (Path(w.home) / ".tpuops-run.lock").exists()  # no run lock taken
