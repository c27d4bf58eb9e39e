"""Every cloud backend passes the same contract against the emulator: made, found in its zone and in every
zone, listed once, read again, its guest attributes and metadata, waited for, deleted. And the registry is the
one place that chooses: each kind has its backend, and a create goes to the backend of its kind."""

from __future__ import annotations

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud import backends, vm_state
from tpuops.cloud.accelerators import parse
from tpuops.cloud.backends import REGISTRY, Listing, backend_of, for_create
from tpuops.cloud.client import ApiNotFoundError
from tpuops.cloud.create import CreateRequest

ZONE = "us-east5-a"
# kind -> (accelerator type, API, slices, runtime version or image)
SHAPES = {
    "node": ("v4-8", "tpu", 1, "base"),
    "multislice": ("v4-8", "tpu", 2, "base"),
    "instance": ("tpu7x-8", "compute", 1, ""),
    "mig": ("tpu7x-16", "compute", 1, ""),
}


def test_every_registered_backend_has_a_contract_shape() -> None:
    assert set(SHAPES) == set(REGISTRY)
    for kind, (acc, api, slices, _) in SHAPES.items():
        assert for_create(api, parse(acc).hosts, slices) is REGISTRY[kind]
        assert REGISTRY[kind].kind == kind and REGISTRY[kind].api == api


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_backend_contract(cloud: Cloud, vm_name: str, kind: str) -> None:
    acc, _, slices, version = SHAPES[kind]
    backend = backends.by_kind(kind)
    api = cloud.api()
    req = CreateRequest(vm_name, acc, version, (ZONE,), wait=True, slices=slices, timeout=120,
                        ssh_keys=f"root:{cloud.public}")  # fmt: skip
    made = backend.create(api, req, version)
    try:
        assert (made.kind, made.zone, made.state, made.accelerator_type) == (kind, ZONE, "READY", acc)
        assert backend_of(made) is backend
        hosts = parse(acc).hosts * slices
        assert len(made.workers) == hosts and [w.index for w in made.workers] == list(range(hosts))

        # found in its zone (by every backend in the registry's order) and in every zone
        assert backend.get(api, ZONE, vm_name) == made
        assert vm_state.find_in_zone(api, ZONE, vm_name, None) == made
        assert backend.find(api, vm_name, Listing([])) == [made]
        for other in REGISTRY.values():
            if other is not backend:
                assert vm_name not in {v.name for v in other.find(api, vm_name, Listing([]))}
        # listed once, as one VM, by its backend only
        listed, _, errors = vm_state.list_all(api, [ZONE])
        assert not errors and [v.kind for v in listed if v.name == vm_name] == [kind]
        assert [v.name for v in backend.list_vms(api, Listing([ZONE]))].count(vm_name) == 1

        # workers and host keys
        attrs = backend.guest_attributes(api, made)
        assert len(attrs) == hosts and all(per.get("hostkeys") for per in attrs)
        assert len(backend.instance_names(made, attrs)) == hosts or kind in ("node", "multislice")

        # metadata: the change lands, every other key is kept
        backend.update_metadata(api, made, {"tpuops-contract": "1"})
        again = vm_state.refresh(api, made)
        assert again.metadata.get("tpuops-contract") == "1" and "ssh-keys" in again.metadata
        assert backend.lost_reason(made, again) is None and vm_state.lost_reason(made, again) is None

        assert vm_state.wait_state(api, ZONE, vm_name, kind, "READY", 30) is not None
    finally:
        vm = vm_state.refresh(api, made)
        backend.delete(api, vm, 120)
    assert vm_state.wait_state(api, ZONE, vm_name, kind, "DELETED", 60) is None
    with pytest.raises(ApiNotFoundError):
        backend.get(api, ZONE, vm_name)
