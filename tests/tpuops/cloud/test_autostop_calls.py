"""A VM's autostop without a network: the setting as the CLI takes it and the metadata keeps it, and the REST calls
each backend gives its watcher (the emulator's endpoint and Google's), a multislice refusing to stop."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpuops.cloud import autostop
from tpuops.cloud.client import Api
from tpuops.cloud.tpu_api import VmInfo
from tpuops.errors import UsageError

VM = VmInfo("v", "us-east1-d", "p", "READY", "HEALTHY", "v4-8", "base", False, False, ())


def _api(endpoint: str | None) -> Api:
    return Api(None, "p", endpoint, lambda _m: None)


def test_the_setting_from_the_command_line_and_back_from_the_metadata() -> None:
    setting = autostop.parse("30m", "Delete")
    assert setting == autostop.Autostop(1800, "delete") and setting.words == "delete after 30m idle"
    assert autostop.parse("off") is None
    assert autostop.of(replace(VM, metadata={autostop.KEY: setting.value})) == setting
    for kept in ("off", "", "30m stop", "1800s pause"):
        assert autostop.of(replace(VM, metadata={autostop.KEY: kept})) is None
    with pytest.raises(UsageError, match="stop or delete"):
        autostop.parse("30m", "hibernate")
    with pytest.raises(UsageError, match="not a duration"):
        autostop.parse("soon")


@pytest.mark.parametrize(
    ("kind", "action", "calls"),
    [
        ("node", "stop", [("POST", "{tpu}/v2/projects/p/locations/us-east1-d/nodes/v:stop")]),
        ("node", "delete", [("DELETE", "{tpu}/v2/projects/p/locations/us-east1-d/nodes/v")]),
        ("instance", "stop", [("POST", "{ce}/compute/v1/projects/p/zones/us-east1-d/instances/v/stop")]),
        ("instance", "delete", [("DELETE", "{ce}/compute/v1/projects/p/zones/us-east1-d/instances/v")]),
        (
            "mig",
            "stop",
            [("POST", "{ce}/compute/v1/projects/p/zones/us-east1-d/instanceGroupManagers/v/resize?size=0")],
        ),
        (
            "mig",
            "delete",
            [("DELETE", "{ce}/compute/v1/projects/p/zones/us-east1-d/instanceGroupManagers/v")],
        ),
        (
            "multislice",
            "delete",
            [("DELETE", "{tpu}/v2/projects/p/locations/us-east1-d/queuedResources/v?force=true")],
        ),
    ],
)
def test_each_backend_names_the_call_that_stops_or_deletes_its_own_vm(
    kind: str, action: str, calls: list[tuple[str, str]]
) -> None:
    vm = replace(
        VM,
        kind=kind,
        queued_resource="projects/p/locations/us-east1-d/queuedResources/v" if kind == "multislice" else "",
    )
    google = [
        (m, u.format(tpu="https://tpu.googleapis.com", ce="https://compute.googleapis.com")) for m, u in calls
    ]
    assert autostop.calls(_api(None), vm, action) == google
    emulator = [(m, u.format(tpu="http://127.0.0.1:9", ce="http://127.0.0.1:9")) for m, u in calls]
    assert autostop.calls(_api("http://127.0.0.1:9/"), vm, action) == emulator


def test_a_node_from_a_queued_resource_is_deleted_with_it_and_a_multislice_is_never_stopped() -> None:
    qr = "projects/p/locations/us-east1-d/queuedResources/v"
    node = replace(VM, queued_resource=qr)
    assert autostop.calls(None, node, "delete") == [
        ("DELETE", f"https://tpu.googleapis.com/v2/{qr}?force=true")
    ]
    with pytest.raises(UsageError, match="multislice") as refused:
        autostop.check(replace(VM, kind="multislice", queued_resource=qr), autostop.Autostop(60, "stop"))
    assert refused.value.hint == "use --autostop-action delete"


def test_what_the_watcher_published_in_words() -> None:
    assert autostop.status("idle 1000 1600", now=1300) == "idle: acts at 1970-01-01 00:26:40 UTC (in 5m)"
    assert autostop.status("busy run r1 pid 7").startswith("busy (run r1 pid 7)")
    assert autostop.status("").startswith("no watcher has reported")
