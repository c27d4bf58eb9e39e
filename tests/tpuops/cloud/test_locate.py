"""`--vm NAME`: found with and without a zone, documented errors, host keys from guest attributes."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud import locate
from tpuops.cloud.create import CreateRequest, create_vm
from tpuops.config import TargetSpec
from tpuops.errors import CloudError, HostKeyError, PreemptedError, UsageError
from tpuops.transport.ssh import SshTransport


def _make(cloud: Cloud, name: str, zone: str = "us-east1-d", accel: str = "v4-16") -> None:
    create_vm(cloud.api(), CreateRequest(name, accel, "tpu-ubuntu2204-base", (zone,)))


def _spec(cloud: Cloud, name: str, **kw: object) -> TargetSpec:
    return TargetSpec(vm=name, api_endpoint=cloud.url, identity=str(cloud.identity), **kw)  # type: ignore[arg-type]


def _transport(cloud: Cloud, spec: TargetSpec) -> SshTransport:
    workers = locate.locate_workers(spec, notify=cloud.notes.append)
    return SshTransport(
        workers, known_hosts=Path(os.environ["TPUOPS_HOME"]) / "known_hosts", identity=cloud.identity
    )


def test_found_without_zone_then_from_the_cache(cloud: Cloud, vm_name: str) -> None:
    _make(cloud, vm_name, zone="europe-west4-a")
    model = cloud.emu.model
    n = len(model.requests)
    workers = locate.locate_workers(_spec(cloud, vm_name))
    first = cloud.calls(n)
    # One location list, then one node list per zone (in parallel), then the guest attributes.
    assert sum(r.endswith("/nodes") for r in first) == len(model.zones)
    assert [w.index for w in workers] == [0, 1]
    cache = json.loads((Path(os.environ["TPUOPS_HOME"]) / "zone-cache.json").read_text())
    assert [v["zone"] for k, v in cache.items() if k.endswith(f"|{vm_name}")] == ["europe-west4-a"]
    n = len(model.requests)
    assert locate.locate_workers(_spec(cloud, vm_name)) == workers
    assert cloud.calls(n) == [
        f"GET /v2/projects/tpuops-emulator/locations/europe-west4-a/nodes/{vm_name}",
        f"POST /v2/projects/tpuops-emulator/locations/europe-west4-a/nodes/{vm_name}:getGuestAttributes",
    ]


def test_stale_cache_entry_falls_back_to_the_search(cloud: Cloud, vm_name: str) -> None:
    _make(cloud, vm_name, zone="us-east1-d", accel="v4-8")
    api = cloud.api()
    locate.remember_zone(api, vm_name, "us-east5-a")  # wrong zone, e.g. the VM was recreated elsewhere
    assert locate.find_vm(api, vm_name, None).zone == "us-east1-d"
    assert locate.cached_zone(api, vm_name) == "us-east1-d"


def test_with_zone_is_one_get(cloud: Cloud, vm_name: str) -> None:
    _make(cloud, vm_name, accel="v4-8")
    n = len(cloud.emu.model.requests)
    assert locate.find_vm(cloud.api(), vm_name, "us-east1-d").name == vm_name
    assert cloud.calls(n) == [f"GET /v2/projects/tpuops-emulator/locations/us-east1-d/nodes/{vm_name}"]


def test_missing_name_lists_close_names(cloud: Cloud, vm_name: str) -> None:
    _make(cloud, vm_name, accel="v4-8")
    typo = vm_name + "x"
    with pytest.raises(CloudError, match=f"TPU VM '{typo}' not found in any of 4 zones") as e:
        locate.find_vm(cloud.api(), typo, None)
    assert f"did you mean {vm_name} (us-east1-d)?" in (e.value.hint or "")
    with pytest.raises(CloudError, match="not found in zone us-east1-d") as e:
        locate.find_vm(cloud.api(), typo, "us-east1-d")
    assert vm_name in (e.value.hint or "") and "omit --zone" in (e.value.hint or "")


def test_same_name_in_two_zones_is_ambiguous(cloud: Cloud, vm_name: str) -> None:
    _make(cloud, vm_name, zone="us-east1-d", accel="v4-8")
    _make(cloud, vm_name, zone="us-central1-a", accel="v4-8")
    with pytest.raises(UsageError, match="exists in several zones: us-central1-a, us-east1-d") as e:
        locate.find_vm(cloud.api(), vm_name, None)
    assert e.value.hint == "pass --zone us-central1-a"


def test_preempted_vm_is_reported_with_the_fix(cloud: Cloud, vm_name: str) -> None:
    _make(cloud, vm_name, accel="v4-8")
    cloud.emu.admin("preempt", node=vm_name)
    with pytest.raises(PreemptedError, match=f"{vm_name} in us-east1-d was preempted") as e:
        locate.locate_workers(_spec(cloud, vm_name, zone="us-east1-d"))
    assert "tpuops vm delete" in (e.value.hint or "")


def test_vm_that_is_not_ready_names_its_state(cloud: Cloud, vm_name: str) -> None:
    _make(cloud, vm_name, accel="v4-8")
    rec = next(r for k, r in cloud.emu.model.nodes.items() if k.endswith(f"/{vm_name}"))
    rec.state = "STOPPED"
    with pytest.raises(CloudError, match="is STOPPED, not READY") as e:
        locate.locate_workers(_spec(cloud, vm_name))
    assert "tpuops vm wait" in (e.value.hint or "")


def test_pinned_host_keys_connect_and_a_changed_key_is_refused(cloud: Cloud, vm_name: str) -> None:
    _make(cloud, vm_name)
    rec = next(r for k, r in cloud.emu.model.nodes.items() if k.endswith(f"/{vm_name}"))
    spec = _spec(cloud, vm_name)
    workers = locate.locate_workers(spec)
    assert [w.hostkey for w in workers] == [w.fingerprint for w in rec.workers]
    assert [(w.host, w.port, w.user) for w in workers] == [("127.0.0.2", s.port, s.user) for s in rec.workers]
    t = _transport(cloud, spec)
    try:
        assert [t.run(i, "whoami").stdout.strip() for i in (0, 1)] == [s.user for s in rec.workers]
    finally:
        t.close()
    assert not (Path(os.environ["TPUOPS_HOME"]) / "known_hosts").exists()  # pinned, nothing written
    cloud.emu.admin("swap-host-key", node=vm_name, worker=1)
    t = _transport(cloud, spec)
    try:
        assert t.run(0, "true").ok
        with pytest.raises(
            HostKeyError, match=f"host key of w1 .* is {re.escape(rec.workers[1].fingerprint)}, expected"
        ):
            t.connect(1)
    finally:
        t.close()


def test_user_fingerprint_overrides_guest_attributes(cloud: Cloud, vm_name: str) -> None:
    _make(cloud, vm_name, accel="v4-8")
    rec = next(r for k, r in cloud.emu.model.nodes.items() if k.endswith(f"/{vm_name}"))
    wrong = "SHA256:" + "A" * 43
    with pytest.raises(HostKeyError, match="expected SHA256:AAAA"):
        _transport(cloud, _spec(cloud, vm_name, hostkey=(wrong,))).connect(0)
    t = _transport(cloud, _spec(cloud, vm_name, hostkey=(rec.workers[0].fingerprint,)))
    try:
        assert t.run(0, "echo ok").stdout == "ok\n"
    finally:
        t.close()
    with pytest.raises(UsageError, match=r"got 2 host keys for .*'s 1 workers"):
        locate.locate_workers(_spec(cloud, vm_name, hostkey=(wrong, wrong)))


def test_internal_ip_on_request(cloud: Cloud, vm_name: str) -> None:
    _make(cloud, vm_name, accel="v4-8")
    (w,) = locate.locate_workers(_spec(cloud, vm_name, internal_ip=True))
    assert w.host == "127.0.0.1"
    t = SshTransport([w], known_hosts=Path(os.environ["TPUOPS_HOME"]) / "kh", identity=cloud.identity)
    try:
        assert t.run(0, "true").ok
    finally:
        t.close()


def test_user_from_spec_wins(cloud: Cloud, vm_name: str) -> None:
    _make(cloud, vm_name, accel="v4-8")
    (w,) = locate.locate_workers(_spec(cloud, vm_name, user="someone"))
    assert w.user == "someone"
