"""Each repository's home on an emulated two-worker VM (the TPU API emulator, real sshd workers): `tpuops doctor`
lists them with their size and last use; `tpuops vm clean` removes those not in use and unused long enough, never
one while a run holds the worker's run lock, nor one a process works in."""

from __future__ import annotations

import json
import pwd
import subprocess
import time
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tests.tpuops.cloud.vms import Vm, create_vm, tpuops

pytestmark = pytest.mark.slow

HOMES = ("old-aaaaaaaa", "new-bbbbbbbb")
MAKE = """set -e; cd "$HOME"; mkdir -p tpuops/notahome/checkout
for h in old-aaaaaaaa new-bbbbbbbb; do mkdir -p tpuops/$h/checkout/.git tpuops/$h/venv/bin
  head -c 40000 /dev/urandom > tpuops/$h/venv/bin/python; : > tpuops/$h/checkout/.git/FETCH_HEAD; done
touch -d '10 days ago' tpuops/old-aaaaaaaa/checkout/.git/FETCH_HEAD
"""


def _as(vm: Vm, k: int) -> list[str]:
    """Run as worker k's own Unix user (setpriv execs: the pid started is the command's own)."""
    pw = pwd.getpwnam(vm.users[k])
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"]


def _homes(data: list[dict], k: int) -> dict[str, dict]:
    return {h["name"]: h for h in data[k]["homes"]}


def test_doctor_lists_the_homes_and_clean_keeps_those_in_use(
    cloud: Cloud, vm_name: str, tmp_path: Path
) -> None:
    vm = create_vm(cloud, vm_name, "v4-16", {}, tmp_path)
    here = tmp_path / "empty"  # no .env to compare, no checkout
    here.mkdir()
    for k in (0, 1):
        subprocess.run([*_as(vm, k), "sh", "-c", MAKE], env={"HOME": str(vm.homes[k])}, check=True)

    looked = tpuops(cloud, ["doctor", *vm.target(), "--json"], here)
    assert looked.returncode == 0, looked.stderr[-3000:]
    data = json.loads(looked.stdout)
    for k in (0, 1):
        found = _homes(data, k)
        assert set(found) == set(HOMES)  # notahome is no repository's home: never listed, never removed
        assert all(h["kb"] >= 39 and h["state"] == "listed" and h["why"] == "" for h in found.values())
        assert (
            time.time() - found["old-aaaaaaaa"]["used"]
            > 9 * 86400
            > time.time() - found["new-bbbbbbbb"]["used"]
        )
        assert found["new-bbbbbbbb"]["path"] == "~/tpuops/new-bbbbbbbb"
    said = tpuops(cloud, ["doctor", *vm.target()], here)
    assert "homes: each repository's checkout and venv" in said.stderr and "(10 d ago)" in said.stderr
    assert f"tpuops vm clean {vm.name} [--older-than 7d]" in said.stderr

    # Worker 0: a process works in the new home. Worker 1: a live run holds the run lock.
    lock = vm.homes[1] / ".tpuops-run.lock"
    holders = [
        subprocess.Popen(
            [*_as(vm, 0), "sleep", "300"], cwd=vm.homes[0] / "tpuops" / "new-bbbbbbbb" / "checkout"
        ),
        subprocess.Popen([*_as(vm, 1), "sleep", "300"], cwd="/"),
    ]
    try:
        subprocess.run([*_as(vm, 1), "mkdir", str(lock)], check=True)
        subprocess.run(
            [
                *_as(vm, 1),
                "sh",
                "-c",
                f"echo someone-elses-run > {lock}/run; echo {holders[1].pid} > {lock}/pid",
            ],
            check=True,
        )
        r = tpuops(cloud, ["vm", "clean", vm.name, "--zone", "us-east1-d", "--identity", str(cloud.identity),
                           "--older-than", "7d", "--json"], here)  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        done = json.loads(r.stdout)["homes"]
        by = {(h["worker"], h["name"]): h for h in done}
        assert by[0, "old-aaaaaaaa"]["state"] == "removed"
        assert by[0, "new-bbbbbbbb"]["state"] == "kept: in use"
        assert by[0, "new-bbbbbbbb"]["why"] == f"process {holders[0].pid} works in it"
        for name in HOMES:
            assert by[1, name]["state"] == "kept: in use"
            assert by[1, name]["why"] == "run someone-elses-run holds the run lock"
        assert not (vm.homes[0] / "tpuops" / "old-aaaaaaaa").exists()
        assert all((vm.homes[1] / "tpuops" / name / "venv").is_dir() for name in HOMES)
        assert (lock / "run").read_text() == "someone-elses-run\n"  # the run's lock, untouched
    finally:
        for p in holders:
            p.kill()
            p.wait()
    subprocess.run(["rm", "-rf", str(lock)], check=True)

    r = tpuops(
        cloud, ["vm", "clean", vm.name, "--zone", "us-east1-d", "--identity", str(cloud.identity)], here
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "removed 3 (" in r.stderr, r.stderr
    for k in (0, 1):
        assert sorted(p.name for p in (vm.homes[k] / "tpuops").iterdir()) == ["notahome"]
        assert not (vm.homes[k] / ".tpuops-run.lock").exists()  # the clean gave its own lock back
