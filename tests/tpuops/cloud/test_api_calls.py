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


def test_a_mig_slice_run_asks_compute_engine_once_per_kind(
    cloud: Cloud, vm_name: str, tmp_path: Path
) -> None:
    """A 2-worker MIG found with --zone and no zone cache (the worst case): one call of each kind (the TPU
    API's nodes.get and Compute's instances.get answer 404 first), one guest-attributes read per instance, all
    Compute calls from one set of clients."""
    made = cloud.cli("vm", "create", vm_name, "--type", "tpu7x-16", "--zone", ZONE)
    assert made.returncode == 0, made.stderr
    n = len(cloud.emu.model.requests)
    argv = ["run", "exec", "--vm", vm_name, "--zone", ZONE, "--identity", str(cloud.identity)]
    r = cloud.cli(*argv, "--set", "cmd=hostname", cwd=tmp_path, env={"TPUOPS_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    assert sorted(ln.split()[0] for ln in r.stderr.splitlines() if ln.startswith("[w")) == ["[w0]", "[w1]"]
    calls = [c for c in cloud.emu.model.requests[n:] if c.purpose != "watch" and "/operations/" not in c.path]
    zone = f"/compute/v1/projects/tpuops-emulator/zones/{ZONE}"
    kinds = collections.Counter(
        c.line.replace(zone, "").replace(f"/v2/projects/tpuops-emulator/locations/{ZONE}", "tpu:")
        .replace(vm_name, "NAME").split("?")[0]
        for c in calls
    )  # fmt: skip
    guest = [k for k in kinds if k.endswith("/getGuestAttributes")]
    assert len(guest) == 2 and all(kinds[k] == 1 for k in guest), kinds  # one per instance
    assert kinds["GET tpu:/nodes/NAME"] == 1 and kinds["GET /instances/NAME"] == 1, kinds
    assert kinds["GET /instanceGroupManagers/NAME"] == 1, kinds
    assert kinds["POST /instanceGroupManagers/NAME/listManagedInstances"] == 1, kinds
    assert kinds["GET /instances"] == 1, kinds  # the members' addresses and metadata: one filtered list
    others = {k: v for k, v in kinds.items() if v > 1 and not k.endswith("/setMetadata")}
    assert not others, others
    compute_clients = {c.client for c in calls if c.path.startswith("/compute/v1/") and c.path.count("/") > 4}
    assert len(compute_clients) == 1 and "" not in compute_clients, compute_clients
