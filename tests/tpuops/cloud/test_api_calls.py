"""A `--vm` run asks the TPU API for its VM once: one client, one get_node, one guest-attributes call."""

from __future__ import annotations

import collections
from pathlib import Path

from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud.emulator.records import ApiRequest
from tpuops.config import TargetSpec
from tpuops.run import launch
from tpuops.run.result import RunResult

ZONE = "us-east1-d"


def _vm(cloud: Cloud, name: str) -> None:
    made = cloud.cli("vm", "create", name, "--type", "v4-16", "--zone", ZONE, "--runtime-version", "base")
    assert made.returncode == 0, made.stderr


def _kinds(calls: list[ApiRequest], name: str) -> collections.Counter[str]:
    """How often the run asked for this VM by method (nodes.get, getGuestAttributes), others by line."""
    node = f"/locations/{ZONE}/nodes/{name}"
    kinds = {f"GET {node}": "nodes.get", f"POST {node}:getGuestAttributes": "getGuestAttributes"}
    return collections.Counter(
        kinds.get(c.line.replace("/v2/projects/tpuops-emulator", ""), c.line) for c in calls
    )


def test_a_vm_run_resolves_its_target_once_with_one_client(
    cloud: Cloud, vm_name: str, tmp_path: Path
) -> None:
    """The whole CLI in its own process, on two sshd workers (the measurement in docs/performance.md)."""
    _vm(cloud, vm_name)
    n = len(cloud.emu.model.requests)
    argv = ["run", "exec", "--vm", vm_name, "--zone", ZONE, "--identity", str(cloud.identity)]
    r = cloud.cli(*argv, "--set", "cmd=echo ran-on-$(hostname)", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ran = sorted(ln.split()[0] for ln in r.stderr.splitlines() if " ran-on-" in ln and ln.startswith("[w"))
    assert ran == ["[w0]", "[w1]"], r.stderr  # both workers ran it
    calls = cloud.emu.model.requests[n:]
    kinds = _kinds([c for c in calls if c.purpose != "watch"], vm_name)
    assert (kinds["nodes.get"], kinds["getGuestAttributes"]) == (1, 1), kinds
    # Every TPU API call of the run came from one TpuClient (operation polls go out unmarked).
    tpu_calls = [c for c in calls if c.path.startswith("/v2/") and "/operations/" not in c.path]
    clients = {c.client for c in tpu_calls}
    assert len(clients) == 1 and "" not in clients, clients


def test_the_watch_polls_are_marked_and_the_run_still_asks_once(
    cloud: Cloud, vm_name: str, tmp_path: Path
) -> None:
    """In-process, with the watch every 0.2 s: its get_node polls carry purpose `watch` and the same client."""
    _vm(cloud, vm_name)
    spec = TargetSpec(vm=vm_name, zone=ZONE, api_endpoint=cloud.url, identity=str(cloud.identity))
    n = len(cloud.emu.model.requests)
    report = launch.start(
        launch.RunRequest(sop="exec", sets={"cmd": "sleep 1.5"}, target=spec), watch_s=0.2, cwd=tmp_path
    )
    assert isinstance(report, RunResult) and report.ok, report.first_failure()
    calls = cloud.emu.model.requests[n:]
    watch = [c for c in calls if c.purpose == "watch"]
    assert len(watch) >= 3, calls  # 1.5 s of job, polled every 0.2 s
    assert {c.line.rsplit("/", 1)[-1] for c in watch} == {vm_name}  # nothing but the VM's get_node
    kinds = _kinds([c for c in calls if c.purpose != "watch"], vm_name)
    assert (kinds["nodes.get"], kinds["getGuestAttributes"]) == (1, 1), kinds
    assert {c.client for c in watch} == {c.client for c in calls if c.path.endswith(":getGuestAttributes")}
