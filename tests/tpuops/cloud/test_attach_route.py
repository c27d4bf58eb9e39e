"""attach on a VM run: it logs in by the route the run recorded (no cloud API call but the VM watch's polls), looks
the VM up again only when that route is dead, and a VM lost while attached ends it with exit 8 within the run's
own `unreachable_s` (saying how to recover a run started with --recover)."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud.emulator.records import ApiRequest
from tpuops.cloud.emulator.sshd import free_port
from tpuops.config import TargetSpec
from tpuops.errors import ExitCode
from tpuops.run import detached, launch, store

ZONE = "us-east1-d"
# A job of `steps` step lines 0.1 s apart, followed as a run follows one; its log fetched at the end.
SOP = """name: ticker
params:
  steps: {type: int, default: 40}
scan: {source: log, warmup: 1}
steps:
  - kind: run
    command: "i=0; while [ $i -lt {steps} ]; do echo step=$i dt=0.1s; sleep 0.1; i=$((i+1)); done"
    runs_dir: ~/runs
  - kind: follow
    runs_dir: ~/runs
    poll_s: 0.1
    timeout: 300
  - kind: fetch_log
    runs_dir: ~/runs
"""


def _vm(cloud: Cloud, name: str) -> None:
    made = cloud.cli("vm", "create", name, "--type", "v4-8", "--zone", ZONE, "--runtime-version", "base")
    assert made.returncode == 0, made.stderr


def _sop(tmp_path: Path) -> Path:
    path = tmp_path / "ticker.yaml"
    path.write_text(SOP)
    return path


def _detached(cloud: Cloud, vm_name: str, tmp_path: Path, run_id: str) -> None:
    """The ticker started on the VM and detached (as the first Ctrl-C does) once its job printed step 2."""
    detach = threading.Event()

    def seen(_w: int, line: str) -> None:
        if line.startswith("step=2 "):
            detach.set()

    spec = TargetSpec(vm=vm_name, zone=ZONE, api_endpoint=cloud.url, identity=str(cloud.identity))
    req = launch.RunRequest(sop=str(_sop(tmp_path)), target=spec, run_id=run_id)
    result = launch.start(req, watch_s=0.2, on_line=seen, detach=detach, cwd=tmp_path)
    assert result.code == ExitCode.INTERRUPTED, result.first_failure()


def _asked(calls: list[ApiRequest], name: str) -> collections.Counter[str]:
    """The calls that were not the VM watch's, by method and path (the VM's name as NAME, no query)."""
    return collections.Counter(
        c.line.split("?")[0].replace(name, "NAME")
        for c in calls
        if c.purpose != "watch" and "/operations/" not in c.path
    )


def test_attach_logs_in_by_the_recorded_route_and_asks_no_api_but_the_watch(
    cloud: Cloud, vm_name: str, tmp_path: Path
) -> None:
    _vm(cloud, vm_name)
    run_id = f"route-{vm_name}"
    _detached(cloud, vm_name, tmp_path, run_id)
    route = store.load(run_id).route
    assert route is not None and route["vm"]["name"] == vm_name and route["via"] == "external"
    (w0,) = route["workers"]
    assert (w0["hostkey"] or "").startswith("SHA256:") and w0["user"], w0  # as the run logged in
    n = len(cloud.emu.model.requests)
    attached = detached.attach(run_id, on_line=None)
    assert attached.code == ExitCode.OK and attached.log.steps == 40, attached
    calls = cloud.emu.model.requests[n:]
    assert not _asked(calls, vm_name), _asked(calls, vm_name)  # no describe, no list, no key check
    watch = [c for c in calls if c.purpose == "watch"]
    assert watch and {c.line.rsplit("/", 1)[-1] for c in watch} == {vm_name}  # only the VM's own get


def test_attach_whose_recorded_route_is_dead_looks_the_vm_up_once(
    cloud: Cloud, vm_name: str, tmp_path: Path
) -> None:
    _vm(cloud, vm_name)
    run_id = f"dead-{vm_name}"
    _detached(cloud, vm_name, tmp_path, run_id)
    path = Path(os.environ["TPUOPS_HOME"]) / "runs" / run_id / "run.json"
    record = json.loads(path.read_text())
    record["route"]["workers"][0]["port"] = (
        free_port()
    )  # the worker's SSH port changed: nothing listens there
    path.write_text(json.dumps(record))
    n = len(cloud.emu.model.requests)
    attached = detached.attach(run_id, on_line=None)
    assert attached.code == ExitCode.OK and attached.log.steps == 40, attached
    asked = _asked(cloud.emu.model.requests[n:], vm_name)
    node = f"/v2/projects/tpuops-emulator/locations/{ZONE}/nodes/NAME"
    assert asked[f"GET {node}"] == 1 and asked[f"POST {node}:getGuestAttributes"] == 1, asked
    assert max(asked.values()) == 1, asked  # each call once: one lookup, not one per retry


def test_attach_of_a_run_over_iap_opens_its_tunnels_again_and_asks_no_api(
    cloud: Cloud, vm_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A VM with no external IP: the run reached it through IAP; attach tunnels to the recorded instances."""
    from tpuops.cloud.vm_state import wait_state

    api = cloud.api()
    node = {"accelerator_type": "v4-8", "runtime_version": "base",
            "network_config": {"network": "default", "enable_external_ips": False}}  # fmt: skip
    api.call("create", api.client.create_node, parent=api.parent(ZONE), node_id=vm_name, node=node)
    wait_state(api, ZONE, vm_name, "node", "READY", 60)
    monkeypatch.setenv(
        "TPUOPS_GCLOUD", f"{sys.executable} -m tpuops.cloud.emulator.iap --api-endpoint {cloud.url}"
    )
    run_id = f"iap-{vm_name}"
    _detached(cloud, vm_name, tmp_path, run_id)
    route = store.load(run_id).route
    assert route is not None and route["via"] == "iap" and len(route["instances"]) == 1, route
    assert route["workers"][0]["host"] != "127.0.0.1"  # the worker's own address, not the run's tunnel
    n = len(cloud.emu.model.requests)
    attached = detached.attach(run_id, on_line=None)
    assert attached.code == ExitCode.OK and attached.log.steps == 40, attached
    asked = _asked(cloud.emu.model.requests[n:], vm_name)
    assert not [k for k in asked if "/nodes" in k or "/compute/" in k], (
        asked
    )  # no describe, list or key check


def _env(cloud: Cloud, home: Path) -> dict[str, str]:
    return {**os.environ, "TPUOPS_HOME": str(home), "TPUOPS_TPU_API": cloud.url}


def _detach_cli(cloud: Cloud, vm_name: str, tmp_path: Path, *extra: str) -> str:
    """`tpuops sop run` of a long ticker on the VM with `extra` flags, detached by Ctrl-C once its job printed
    step 2; its run id."""
    home, log = tmp_path / "home", tmp_path / "run.err"
    argv = [sys.executable, "-m", "tpuops", "sop", "run", str(_sop(tmp_path)), "--vm", vm_name, "--zone", ZONE,
            "--identity", str(cloud.identity), "--set", "steps=3000", *extra]  # fmt: skip
    with log.open("w") as err:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=_env(cloud, home), stdout=subprocess.DEVNULL, stderr=err,
                                stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while "step=2 " not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)  # the first Ctrl-C: stop following, the job goes on
            assert proc.wait(timeout=60) == ExitCode.INTERRUPTED, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    (run,) = json.loads(cloud.cli("runs", "--json", "--offline", env={"TPUOPS_HOME": str(home)}).stdout)
    return str(run["run_id"])


@pytest.mark.parametrize("recover", [False, True], ids=["watched", "recover"])
def test_a_vm_preempted_during_attach_ends_it_with_exit_8_within_a_minute(
    cloud: Cloud, vm_name: str, tmp_path: Path, recover: bool
) -> None:
    _vm(cloud, vm_name)
    run_id = _detach_cli(
        cloud, vm_name, tmp_path, "--unreachable-s", "20", *(["--recover"] if recover else [])
    )
    err = tmp_path / "attach.err"
    with err.open("w") as out:
        attach = subprocess.Popen(
            [sys.executable, "-m", "tpuops", "attach", run_id], cwd=tmp_path, env=_env(cloud, tmp_path / "home"),
            stdout=subprocess.DEVNULL, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while "[w0] step=" not in err.read_text():  # attached: it shows the job's new lines
                assert attach.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
                time.sleep(0.05)
            cloud.emu.admin("preempt", node=vm_name)
            t0 = time.monotonic()
            code = attach.wait(timeout=60)
        finally:
            if attach.poll() is None:
                attach.kill()
                attach.wait()
    said = err.read_text()
    assert code == ExitCode.PREEMPTED and time.monotonic() - t0 < 60, said[-3000:]
    assert f"{vm_name} was PREEMPTED while attached to run {run_id}" in said, said[-3000:]
    if recover:  # its own client would have recreated the VM: how to do it by hand, then resume
        assert (
            f"started with --recover, but its client is gone: recreate it: tpuops vm delete {vm_name}" in said
        )
        assert (
            f"tpuops vm create {vm_name} --zone {ZONE} --type v4-8" in said
            and "resumes from its last" in said
        )
    else:
        assert "rerun with --recover" in said, said[-3000:]
