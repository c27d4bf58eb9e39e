"""The TPU API layer through the real google-cloud-tpu REST client against the emulator."""

from __future__ import annotations

import os
import time

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud import tpu_api
from tpuops.cloud.create import CreateRequest, create_vm
from tpuops.cloud.vm_state import wait_state
from tpuops.errors import CloudError, CommandTimeoutError, PreemptedError, UsageError


def _create(cloud: Cloud, name: str, zone: str = "us-east1-d", **kw: object) -> tpu_api.VmInfo:
    req = CreateRequest(name, str(kw.pop("accel", "v4-8")), "tpu-ubuntu2204-base", (zone,), **kw)  # type: ignore[arg-type]
    return create_vm(cloud.api(), req)


def test_create_describe_list_delete(cloud: Cloud, vm_name: str) -> None:
    vm = _create(cloud, vm_name, accel="v4-16", spot=True, wait=True)
    assert (vm.state, vm.health, vm.accelerator_type, vm.spot, vm.zone) == (
        "READY",
        "HEALTHY",
        "v4-16",
        True,
        "us-east1-d",
    )
    assert len(vm.workers) == 2
    assert all(w.internal_ip == "127.0.0.1" and w.external_ip == "127.0.0.2" for w in vm.workers)
    api = cloud.api()
    assert tpu_api.get_vm(api, "us-east1-d", vm_name) == vm
    listed, zones = tpu_api.list_vms(api)
    assert zones == sorted(cloud.emu.model.zones)
    assert vm_name in [v.name for v in listed]
    assert [v.name for v in tpu_api.list_vms(api, ["us-east5-a"])[0]] == []
    tpu_api.delete_vm(api, "us-east1-d", vm_name, timeout=30)
    assert vm_name not in [v.name for v in tpu_api.list_vms(api, ["us-east1-d"])[0]]


def test_queued_create_goes_active_and_delete_removes_both(cloud: Cloud, vm_name: str) -> None:
    vm = _create(cloud, vm_name, zone="us-east5-a", queued=True, wait=True, spot=True)
    assert vm.state == "READY" and vm.spot
    assert vm.queued_resource.endswith(f"/queuedResources/{vm_name}")
    states = cloud.emu.admin("state")["queuedResources"]
    assert states[vm.queued_resource] == "ACTIVE"
    assert any("PROVISIONING" in n or "ACTIVE" in n or "READY" in n for n in cloud.notes)
    tpu_api.delete_vm(cloud.api(), "us-east5-a", vm_name, timeout=30)
    after = cloud.emu.admin("state")
    assert vm.queued_resource not in after["queuedResources"]
    assert not any(n.endswith(f"/{vm_name}") for n in after["nodes"])


def test_queued_without_capacity_times_out_naming_the_state(cloud: Cloud, vm_name: str) -> None:
    cloud.emu.admin("faults", capacity={"us-east5-a": 1})
    with pytest.raises(CommandTimeoutError, match="still WAITING_FOR_RESOURCES after 1s"):
        _create(cloud, vm_name, zone="us-east5-a", queued=True, wait=True, timeout=1.0)


def test_capacity_error_tries_the_next_zone(cloud: Cloud, vm_name: str) -> None:
    cloud.emu.admin("faults", capacity={"us-east1-d": 1})
    req = CreateRequest(vm_name, "v6e-8", "v2-alpha-tpuv6e", ("us-east1-d", "europe-west4-a"))
    vm = create_vm(cloud.api(), req)
    assert vm.zone == "europe-west4-a" and vm.state == "READY"
    assert any("no more capacity" in n and "us-east1-d" in n for n in cloud.notes)


def test_capacity_everywhere_is_reported_plainly(cloud: Cloud, vm_name: str) -> None:
    cloud.emu.admin("faults", capacity={"*": 2})
    req = CreateRequest(vm_name, "v6e-8", "v2-alpha-tpuv6e", ("us-east1-d", "europe-west4-a"))
    with pytest.raises(CloudError, match="no capacity for v6e-8 in us-east1-d, europe-west4-a") as e:
        create_vm(cloud.api(), req)
    assert "--queued" in (e.value.hint or "")


def test_create_needs_a_zone_and_queued_takes_one(cloud: Cloud, vm_name: str) -> None:
    with pytest.raises(UsageError, match="needs --zone"):
        create_vm(cloud.api(), CreateRequest(vm_name, "v4-8", "rt", ()))
    with pytest.raises(UsageError, match="--queued takes one --zone"):
        create_vm(
            cloud.api(), CreateRequest(vm_name, "v4-8", "rt", ("us-east1-d", "us-east5-a"), queued=True)
        )


def test_invalid_accelerator_type_is_refused_by_the_api(cloud: Cloud, vm_name: str) -> None:
    with pytest.raises(CloudError, match=r"400 .*unknown accelerator type 'v9-8'"):
        _create(cloud, vm_name, accel="v9-8")


@pytest.mark.parametrize("code", [503, 429])
def test_transient_errors_are_retried_and_reported(cloud: Cloud, vm_name: str, code: int) -> None:
    _create(cloud, vm_name)
    api = cloud.api()
    cloud.emu.admin("faults", unavailable=2, code=code)
    assert tpu_api.get_vm(api, "us-east1-d", vm_name).state == "READY"
    assert len(cloud.notes) == 2
    assert all(f"{code} The service is currently unavailable." in n for n in cloud.notes)
    assert "retry 1/5" in cloud.notes[0] and "retry 2/5" in cloud.notes[1]


def test_retries_are_bounded(cloud: Cloud) -> None:
    api = cloud.api()
    api.retries, api.backoff_s = 2, 0.01
    cloud.emu.admin("faults", unavailable=10)
    t0 = time.monotonic()
    with pytest.raises(CloudError, match="still failing after 2 retries: 503"):
        tpu_api.list_zone(api, "us-east1-d")
    assert time.monotonic() - t0 < 2.0
    assert len(cloud.notes) == 2


def test_wait_reports_preemption_and_deletion(cloud: Cloud, vm_name: str) -> None:
    _create(cloud, vm_name)
    api = cloud.api()
    cloud.emu.admin("preempt", node=vm_name)
    assert tpu_api.get_vm(api, "us-east1-d", vm_name).state == "PREEMPTED"
    with pytest.raises(PreemptedError, match="was preempted") as e:
        wait_state(api, "us-east1-d", vm_name, "node", "READY", timeout=5)
    assert "recreate" in (e.value.hint or "")
    with pytest.raises(CommandTimeoutError, match="still PREEMPTED after 0s"):
        wait_state(api, "us-east1-d", vm_name, "node", "STOPPED", timeout=0.2)
    cloud.emu.model.delete_node(tpu_api.node_name(api, "us-east1-d", vm_name))
    assert wait_state(api, "us-east1-d", vm_name, "node", "DELETED", timeout=10) is None
    assert any("DELETED" in n for n in cloud.notes)


def test_guest_attributes_carry_each_workers_host_key(cloud: Cloud, vm_name: str) -> None:
    _create(cloud, vm_name, accel="v4-16")
    attrs = tpu_api.host_keys(cloud.api(), "us-east1-d", vm_name)
    rec = cloud.emu.model.nodes[tpu_api.node_name(cloud.api(), "us-east1-d", vm_name)]
    assert len(attrs) == 2
    for per, worker in zip(attrs, rec.workers, strict=True):
        assert f"ssh-ed25519 {per['hostkeys']['ssh-ed25519']}" == worker.host_public_key


def test_queued_without_wait_returns_the_queue_state_then_the_node_comes_up(
    cloud: Cloud, vm_name: str
) -> None:
    vm = _create(cloud, vm_name, zone="us-east5-a", queued=True)
    assert vm.state in ("QUEUED:ACCEPTED", "QUEUED:PROVISIONING", "QUEUED:ACTIVE")
    assert vm.workers == () and vm.queued_resource.endswith(f"/queuedResources/{vm_name}")
    deadline = time.monotonic() + 10
    while not any(n.endswith(f"/nodes/{vm_name}") for n in cloud.emu.model.nodes):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    ready = wait_state(cloud.api(), "us-east5-a", vm_name, "node", "READY", timeout=10)
    assert ready is not None and len(ready.workers) == 1


def test_a_deletion_waits_for_a_preemptions_power_off_and_hands_the_users_back_once(
    cloud: Cloud, vm_name: str
) -> None:
    """The emulator's own ordering: a worker's Unix user goes to the next VM only after every power-off of its
    old worker has ended (a recovery once lost its new worker 0 to the old one's late `pkill -u`), and a
    deletion racing a second teardown (a test's clean-up) hands each user back once, never to two VMs."""
    _create(cloud, vm_name, accel="v4-16", wait=True)
    model, api = cloud.emu.model, cloud.api()
    rec = model.nodes[tpu_api.node_name(api, "us-east1-d", vm_name)]
    users = {w.user for w in rec.workers}
    with rec.power:  # a preemption's power-off still under way
        op = model.delete_node(rec.name)
        time.sleep(0.5)
        with model.lock:
            assert not op.get("done") and not users & set(model.spare)
    assert wait_state(api, "us-east1-d", vm_name, "node", "DELETED", timeout=30) is None
    model._teardown(rec, None)  # the same node torn down again
    with model.lock:
        handed_back = [u for u in model.spare if u in users]
        # As root: this emulator's own users, kept for the next VM.
        leased = {u for u in users if u in model.created}
    assert leased or os.geteuid() != 0
    assert sorted(handed_back) == sorted(leased)
