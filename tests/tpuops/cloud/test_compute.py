"""TPU VMs on Compute Engine against the emulator with the real google-cloud-compute client (REST, anonymous
credentials): a single-host instance and a 2-worker MIG slice made, found without a zone, run on, listed and
deleted through the CLI; the client's retries, 403s, stale fingerprints and stockouts; which API a create uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud import compute_api, compute_create, locate, vm_state
from tpuops.cloud.accelerators import accelerator_of, compute_shape, slice_of
from tpuops.cloud.client import ApiNotFoundError
from tpuops.cloud.create import CreateRequest
from tpuops.cloud.tpu_api import VmInfo
from tpuops.errors import CloudError, PermissionDeniedError, UsageError

ZONE = "us-east5-a"


def _create(cloud: Cloud, name: str, accelerator: str, *zones: str, spot: bool = False) -> VmInfo:
    req = CreateRequest(name, accelerator, "", zones or (ZONE,), spot=spot, wait=True, timeout=60)
    return compute_create.create_vm(cloud.api(), req)


def test_which_api_a_create_uses_and_the_slice_shapes() -> None:
    assert compute_create.choose_api("tpu7x-8", None, None) == "compute"  # TPU7x: Compute Engine only
    assert compute_create.choose_api("tpu7x-8", None, "tpu") == "compute"
    assert compute_create.choose_api("v6e-8", None, None) == "tpu"
    assert compute_create.choose_api("v6e-8", None, "compute") == "compute"  # api = "compute" in tpuops.toml
    assert compute_create.choose_api("v6e-8", "tpu", "compute") == "tpu"  # the flag wins
    with pytest.raises(UsageError, match="Cloud TPU API does not serve TPU7X"):
        compute_create.choose_api("tpu7x-16", "tpu", None)
    with pytest.raises(UsageError, match="expected tpu or compute"):
        compute_create.choose_api("v6e-8", "gce", None)
    shapes = {t: compute_shape(t) for t in ("tpu7x-8", "tpu7x-16", "v6e-8", "v6e-16", "v5p-16")}
    assert [(s.machine_type, s.topology, s.vms) for s in shapes.values()] == [
        ("tpu7x-standard-4t", "2x2x1", 1), ("tpu7x-standard-4t", "2x2x2", 2), ("ct6e-standard-8t", "2x4", 1),
        ("ct6e-standard-4t", "4x4", 4), ("ct5p-hightpu-4t", "2x2x2", 2),
    ]  # fmt: skip
    # Back: the fit preflight's accelerator type from the machine type and the slice's VM count.
    assert slice_of("tpu7x-standard-4t", 2) == ("tpu7x-16", "2x2x2")
    assert accelerator_of("zones/z/machineTypes/ct6e-standard-4t", "4x4") == "v6e-16"
    assert accelerator_of("n2-standard-8") == ""
    with pytest.raises(UsageError, match="no Compute Engine machine type"):
        compute_shape("v4-8")


@pytest.mark.slow
def test_a_single_host_vm_and_a_mig_slice_through_the_cli(cloud: Cloud, vm_name: str, tmp_path: Path) -> None:
    one, mig = f"{vm_name}-a", f"{vm_name}-s"
    made = cloud.cli("vm", "create", one, "--type", "tpu7x-8", "--zone", ZONE, "--spot", "--wait", "--json")
    assert made.returncode == 0, made.stderr
    vm = json.loads(made.stdout)["vm"]
    assert (vm["api"], vm["kind"], vm["machine_type"], vm["topology"], vm["spot"]) == (
        "compute", "instance", "tpu7x-standard-4t", "2x2x1", True,
    )  # fmt: skip
    made = cloud.cli("vm", "create", mig, "--type", "tpu7x-16", "--zone", ZONE, "--wait", "--json")
    assert made.returncode == 0, made.stderr
    compute = cloud.emu.model.compute
    # The slice is a template + a workload policy of the topology + a MIG of two tpu7x-standard-4t VMs.
    (policy,) = [p for k, p in compute.policies.items() if k.endswith(f"/{mig}-wp")]
    assert policy["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    assert any(k.endswith(f"/instanceTemplates/{mig}-tpl") for k in compute.templates)

    # Found without --zone (a fresh state home: no zone cache), reported as Compute Engine with its workers.
    home = tmp_path / "fresh"
    described = cloud.cli("vm", "describe", mig, "--json", env={"TPUOPS_HOME": str(home)})
    assert described.returncode == 0, described.stderr
    vm = json.loads(described.stdout)["vm"]
    assert (vm["api"], vm["kind"], vm["zone"], vm["accelerator_type"], vm["worker_count"]) == (
        "compute", "mig", ZONE, "tpu7x-16", 2,
    )  # fmt: skip
    # Worker order is the worker number Compute Engine gave each instance, not the (random) name order.
    numbers = [compute.instances[f"projects/tpuops-emulator/zones/{ZONE}/instances/{n}"].body["metadata"]
               ["agent-worker-number"] for n in vm["instances"]]  # fmt: skip
    assert numbers == ["0", "1"]

    ran = cloud.cli("run", "exec", "--vm", mig, "--identity", str(cloud.identity), "--set", "cmd=hostname",
                    cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert sorted(ln.split()[0] for ln in ran.stderr.splitlines() if ln.startswith("[w")) == ["[w0]", "[w1]"]
    plan = cloud.cli("run", "exec", "--vm", one, "--set", "cmd=true", "--dry-run", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "Compute Engine instance" in plan.stderr

    listed = cloud.cli("vm", "list", "--zone", ZONE, "--json")
    assert listed.returncode == 0, listed.stderr
    kinds = {v["name"]: (v["api"], v["kind"], v["worker_count"]) for v in json.loads(listed.stdout)["vms"]}
    assert kinds[one] == ("compute", "instance", 1) and kinds[mig] == ("compute", "mig", 2)

    for name in (one, mig):
        gone = cloud.cli("vm", "delete", name, "--yes", "--json")
        assert gone.returncode == 0, gone.stderr
    assert not [k for k in compute.instances if f"/{vm_name}-" in k]
    assert not [k for k in (*compute.migs, *compute.templates, *compute.policies) if f"/{vm_name}-" in k]


def test_the_client_retries_503s_and_403s_name_the_role(cloud: Cloud, vm_name: str) -> None:
    vm = _create(cloud, vm_name, "tpu7x-8")
    api = cloud.api()
    cloud.emu.admin("faults", unavailable=2, code=503)
    assert vm_state.get_vm(api, ZONE, vm_name, "instance").state == "READY"
    retries = [n for n in cloud.notes if "retry" in n]
    assert [n.split("; ")[-1].split(" in ")[0] for n in retries] == ["retry 1/5", "retry 2/5"], cloud.notes
    assert all(n.startswith(f"Compute API get instance {vm_name} in {ZONE}: 503 ") for n in retries), retries
    cloud.emu.admin("faults", unavailable=1, code=403)
    with pytest.raises(PermissionDeniedError) as read:
        vm_state.get_vm(api, ZONE, vm_name, "instance")
    assert "roles/compute.viewer" in read.value.hint
    cloud.emu.admin("faults", unavailable=1, code=403)
    with pytest.raises(PermissionDeniedError) as change:
        vm_state.delete_vm(api, vm, timeout=30)
    assert "roles/compute.instanceAdmin.v1" in change.value.hint
    assert "roles/iam.serviceAccountUser" in change.value.hint
    # setMetadata needs the current fingerprint: a stale one is refused (412), the metadata unchanged.
    compute_api.set_metadata(api, vm, 0, {**vm.instance_metadata[0], "k": "1"})
    with pytest.raises(CloudError, match="412 Supplied fingerprint does not match"):
        compute_api.set_metadata(api, vm, 0, {"k": "2"})
    assert vm_state.get_vm(api, ZONE, vm_name, "instance").metadata["k"] == "1"


def test_a_stockout_moves_on_to_the_next_zone_and_nothing_is_left_behind(cloud: Cloud, vm_name: str) -> None:
    cloud.emu.admin("faults", capacity={ZONE: 1})
    vm = _create(cloud, vm_name, "tpu7x-16", ZONE, "europe-west4-a")
    assert (vm.zone, vm.kind, len(vm.workers)) == ("europe-west4-a", "mig", 2)
    assert any("does not have enough resources" in n for n in cloud.notes), cloud.notes
    compute = cloud.emu.model.compute
    # The refused zone's MIG is gone; its template and policy were made again (and kept) for the next zone.
    assert not [k for k in compute.migs if f"/zones/{ZONE}/" in k and k.endswith(f"/{vm_name}")]
    with pytest.raises(ApiNotFoundError):
        vm_state.get_vm(cloud.api(), ZONE, vm_name, "mig")


def test_a_recreated_mig_instance_has_a_new_host_key_and_the_slice_is_found_again(
    cloud: Cloud, vm_name: str
) -> None:
    vm = _create(cloud, vm_name, "tpu7x-16")
    api = cloud.api()
    before = locate.guest_attributes(api, vm)
    cloud.emu.admin("recreate", node=vm_name, worker=1)
    after_vm = vm_state.get_vm(api, ZONE, vm_name, "mig")
    after = locate.guest_attributes(api, after_vm)
    assert after_vm.instances == vm.instances  # a MIG recreates an instance under its name
    assert after_vm.instance_ids[0] == vm.instance_ids[0] and after_vm.instance_ids[1] != vm.instance_ids[1]
    assert after[0]["hostkeys"] == before[0]["hostkeys"] and after[1]["hostkeys"] != before[1]["hostkeys"]
    from tpuops.run.vmwatch import lost_reason

    assert "had instances recreated (w1" in (lost_reason(vm, after_vm) or "")
    cloud.emu.admin("preempt", node=vm_name, worker=0)
    seen = vm_state.get_vm(api, ZONE, vm_name, "mig")
    assert seen.state in ("PREEMPTED", "REPAIRING", "READY")  # the MIG repairs it within REPAIR_DELAY_S
    assert lost_reason(vm, seen)
