"""Autostop on the emulator with real sshd workers: the watcher that `vm create --autostop` and `vm autostop` start on
worker 0 stops or deletes the idle VM through the API with the VM's own token, turned off it does nothing, and a VM
whose run holds its lock is left alone until the run ends. The watcher looks every second here
(TPUOPS_AUTOSTOP_POLL_S; 30 s by default)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tests.tpuops.cloud.test_tree_vm import _project

pytestmark = pytest.mark.slow
ZONE = "us-east1-d"
FAST = {"TPUOPS_AUTOSTOP_POLL_S": "1"}


def _ok(r: subprocess.CompletedProcess[str]) -> dict:
    assert r.returncode == 0, f"exit {r.returncode}: {r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout)


def _published(cloud: Cloud, workers: list) -> str:
    from tpuops.cloud.emulator import metadata

    items = metadata.guest_items(workers[0].state_dir)
    return next((i["value"] for i in items if (i["namespace"], i["key"]) == ("tpuops", "autostop")), "")


def _until(check: Callable[[], bool], within: float) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < within, f"not within {within:.0f}s"
        time.sleep(0.2)
    return time.monotonic()


def test_an_idle_node_stops_itself_and_autostop_off_ends_the_watcher(cloud: Cloud, vm_name: str) -> None:
    target = ["--zone", ZONE, "--identity", str(cloud.identity)]
    made = _ok(cloud.cli("vm", "create", vm_name, "--accelerator", "v4-8", "--runtime-version", "base",
                         "--autostop", "20s", *target, "--json", env=FAST))  # fmt: skip
    assert made["autostop"]["setting"] == "20s stop" and made["autostop"]["watcher"] == "watching"
    (name,) = [n for n in cloud.emu.model.nodes if n.endswith(f"/nodes/{vm_name}")]
    rec = cloud.emu.model.nodes[name]
    _until(lambda: _published(cloud, rec.workers).startswith("idle "), 30)
    described = _ok(cloud.cli("vm", "describe", vm_name, "--zone", ZONE, "--json"))["autostop"]
    assert described["setting"] == "20s stop" and described["status"].startswith("idle: acts at "), described

    off = _ok(cloud.cli("vm", "autostop", vm_name, "off", *target, "--json", env=FAST))
    assert off["autostop"] == "off" and off["watcher"] == "off"
    _until(lambda: _published(cloud, rec.workers) == "off", 30)  # the watcher said so and ended
    assert _ok(cloud.cli("vm", "describe", vm_name, "--zone", ZONE, "--json"))["autostop"] is None
    assert rec.state == "READY"

    since = len(cloud.emu.model.requests)
    on = _ok(cloud.cli("vm", "autostop", vm_name, "2s", *target, "--json", env=FAST))
    assert on["autostop"] == "2s stop" and on["watcher"] == "watching"
    start = time.monotonic()
    _until(lambda: rec.state == "STOPPED", 240)
    assert time.monotonic() - start < 240
    stop = f"POST /v2/projects/{name.split('/')[1]}/locations/{ZONE}/nodes/{vm_name}:stop"
    assert stop in cloud.calls(since)


def test_a_vm_whose_run_holds_its_lock_is_deleted_only_after_the_run_ends(
    cloud: Cloud, vm_name: str, worker_python: str, tmp_path: Path
) -> None:
    """A Compute Engine instance made with `--autostop 20s --autostop-action delete` runs a 40 s job (twice the idle
    time): present all along, and deleted no sooner than 20 s after the run ended."""
    target = ["--zone", ZONE, "--identity", str(cloud.identity)]
    made = _ok(cloud.cli("vm", "create", vm_name, "--accelerator", "tpu7x-8", "--autostop", "20s",
                         "--autostop-action", "delete", *target, "--json", env=FAST))  # fmt: skip
    assert made["autostop"]["watcher"] == "watching"
    compute = cloud.emu.model.compute
    (name,) = [n for n in compute.instances if n.endswith(f"/instances/{vm_name}")]
    workers = compute.instances[name].workers
    repo = _project(tmp_path, "proj")
    job = "import time; print('step=0 loss=1.0 time=0.1', flush=True); time.sleep(40)"
    run = subprocess.Popen(
        [sys.executable, "-m", "tpuops", "run", "job", "--vm", vm_name, *target, "--json", "--set",
         "lockfile=~/libtpu_lockfile", "--set", f"python={worker_python}", "--", "python", "-u", "-c", job],
        cwd=next(repo), env={**os.environ, "TPUOPS_TPU_API": cloud.url, **FAST}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _until(lambda: _published(cloud, workers).startswith("busy run "), 120)
        while run.poll() is None:  # the whole run long: the instance stays
            assert name in compute.instances and compute.instances[name].status == "RUNNING"
            time.sleep(0.5)
    finally:
        if run.poll() is None:
            run.kill()
        out, err = run.communicate()
        next(repo, None)  # its bare origin removed
    assert run.returncode == 0, f"{out[-2000:]}\n{err[-3000:]}"
    # Idle from when the job ended on worker 0 (its exit file: the lock went with it), not from when this client,
    # slower under load, finished its fetch and report.
    ended = max(f.stat().st_mtime for f in workers[0].home.glob("tpuops/runs/*/worker-0.exit"))
    _until(lambda: name not in compute.instances, 240)
    assert time.time() - ended >= 19, "deleted before it was idle for 20 s"
    assert (
        f"DELETE /compute/v1/projects/{name.split('/')[1]}/zones/{ZONE}/instances/{vm_name}" in cloud.calls()
    )
