"""The bundled trainer on an emulated two-worker VM (the TPU API emulator, real sshd workers): run from a folder
that is no checkout, with no repository named, `run grpo` sends the installed trainer as a git bundle and both
workers train it, in the bundled trainer's own home."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tests.tpuops.cloud.vms import create_vm, ok_json, tpuops
from tpuops.run import bundled
from tpuops.run.tree import repo_home

pytestmark = pytest.mark.slow


def test_the_bundled_trainer_travels_to_both_workers_and_trains(
    cloud: Cloud, vm_name: str, worker_python: str, tmp_path: Path
) -> None:
    code = {"venv": "none", "python": worker_python, "lockfile": "~/libtpu_lockfile"}
    vm = create_vm(cloud, vm_name, "v4-16", code, tmp_path)
    empty = tmp_path / "empty"  # no checkout here or above: nothing names a repository
    empty.mkdir()
    made = bundled.make()  # what the run makes too: the same files, the same commit

    r = tpuops(cloud, [*vm.args("run", "grpo", sets=vm.trainer_sets(2)), "--json"], empty, timeout=400)

    data = ok_json(r)
    assert f"trainer: the one installed with tpuops {made.version}" in r.stderr
    sync = next(s for s in data["steps"] if s["kind"] == "git_sync")
    assert {w["sha"] for w in sync["workers"].values()} == {made.commit[:7]}, sync
    log = data["log"]
    assert log["steps"] == 2 and not log["failures"] and log["start"]["process_count"] == "2"
    assert log["exit_codes"] == {"0": 0, "1": 0}
    home = repo_home(bundled.URL).removeprefix("~/")
    for worker_home in vm.homes:
        checkout = worker_home / home / "checkout"
        assert (checkout / "trainer" / "main.py").read_bytes() == (
            made.repo / "trainer" / "main.py"
        ).read_bytes()
        assert (checkout / "pyproject.toml").read_text() == (made.repo / "pyproject.toml").read_text()
        assert (worker_home / home / "checkout.bundle").read_bytes() == made.bundle.read_bytes()

    planned = tpuops(cloud, [*vm.args("run", "grpo", sets=vm.trainer_sets(2)), "--dry-run", "--json"], empty)
    assert planned.returncode == 0, planned.stderr[-3000:]
    plan = json.dumps(json.loads(planned.stdout))
    assert f"sftp put {made.bundle.name} -> ~/{home}/checkout.bundle" in plan
