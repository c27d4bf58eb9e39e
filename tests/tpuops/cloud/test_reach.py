"""Reaching a VM as gcloud does, against the emulator with real sshd: metadata keys, OS Login, IAP tunnels,
internal IPs for the coordinator, the google_compute_engine key, 403s that name the role."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud import locate
from tpuops.cloud.client import Api, connect
from tpuops.cloud.create import CreateRequest, create_vm
from tpuops.cloud.emulator.sshd import client_keypair
from tpuops.cloud.keys import default_user, ensure_identity
from tpuops.cloud.tpu_api import get_vm
from tpuops.cloud.vm_state import wait_state
from tpuops.config import TargetSpec
from tpuops.errors import ConnectError, PermissionDeniedError
from tpuops.run.result import RunResult
from tpuops.transport.base import Worker
from tpuops.transport.ssh import SshTransport

ZONE = "us-east1-d"
RUNTIME = "tpu-ubuntu2204-base"
_projects = itertools.count()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of this test's own: ~/.ssh/google_compute_engine is made there, never in the real one."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    return h


@pytest.fixture
def project(cloud: Cloud) -> Iterator[str]:
    """A project of this test's own (its metadata, e.g. enable-oslogin, touches no other test)."""
    name = f"proj-{os.getpid() % 1000:03d}-{next(_projects)}"  # a valid project id: 6-30 characters
    yield name
    model = cloud.emu.model
    with model.lock:
        model.projects.pop(name, None)
        model.faults.oslogin_denied = model.faults.iap_denied = False


def _api(cloud: Cloud, project: str) -> Api:
    return connect(project, cloud.url, cloud.notes.append)


def _spec(cloud: Cloud, project: str, name: str, **kw: object) -> TargetSpec:
    return TargetSpec(vm=name, zone=ZONE, project=project, api_endpoint=cloud.url, **kw)  # type: ignore[arg-type]


def _transport(cloud: Cloud, spec: TargetSpec) -> tuple[SshTransport, locate.Reach]:
    cloud.notes.clear()
    found = locate.reach(spec, notify=cloud.notes.append)
    t = SshTransport(
        found.workers,
        known_hosts=Path(os.environ["TPUOPS_HOME"]) / "known_hosts",
        prepare=found.prepare,
        connect_retries=1,
        connect_timeout=5,
    )
    return t, found


def _node(cloud: Cloud, project: str, name: str):
    return cloud.emu.model.nodes[f"projects/{project}/locations/{ZONE}/nodes/{name}"]


def test_metadata_key_is_pushed_to_a_vm_made_elsewhere_and_existing_keys_kept(
    cloud: Cloud, project: str, vm_name: str, home: Path, tmp_path: Path
) -> None:
    _, alice = client_keypair(tmp_path / "alice")
    api = _api(cloud, project)
    create_vm(api, CreateRequest(vm_name, "v4-8", RUNTIME, (ZONE,), ssh_keys=f"alice:{alice}"))
    mine = ensure_identity(None, cloud.notes.append)  # what a gcloud user has; not on the VM yet
    rec = _node(cloud, project, vm_name)
    direct = SshTransport(
        [Worker(0, "127.0.0.2", rec.workers[0].port, rec.workers[0].user, rec.workers[0].fingerprint)],
        known_hosts=home / "kh",
        identity=mine.path,
        connect_retries=1,
    )
    with pytest.raises(ConnectError, match="refused authentication"):
        direct.connect(0)

    t, _ = _transport(cloud, _spec(cloud, project, vm_name))
    try:
        assert t.run(0, "whoami").stdout.strip() == rec.workers[0].user
    finally:
        t.close()
    user = default_user()
    lines = get_vm(api, ZONE, vm_name).metadata["ssh-keys"].splitlines()
    assert lines == [f"alice:{alice}", f"{user}:{mine.blob} {user}"]
    assert any("metadata keys: added" in n and "1 existing entry kept" in n for n in cloud.notes)

    n = len(cloud.emu.model.requests)  # a second run finds the key: no metadata change
    t, _ = _transport(cloud, _spec(cloud, project, vm_name, key_push=False))
    try:
        assert t.run(0, "true").ok
    finally:
        t.close()
    assert not [r for r in cloud.calls(n) if r.startswith("PATCH")]
    assert any("is in the VM's ssh-keys; nothing to add" in n for n in cloud.notes)


def test_os_login_project_imports_the_key_and_logs_in_as_the_posix_user(
    cloud: Cloud, project: str, vm_name: str, home: Path
) -> None:
    gcloud = Path(os.environ["CLOUDSDK_CONFIG"]) / "configurations"
    gcloud.mkdir(parents=True)
    (gcloud / "config_default").write_text("[core]\naccount = ada@example.com\n")
    cloud.emu.admin("project-metadata", project=project, metadata={"enable-oslogin": "TRUE"})
    api = _api(cloud, project)
    create_vm(api, CreateRequest(vm_name, "v4-8", RUNTIME, (ZONE,), ssh_keys=f"alice:{cloud.public}"))
    before = get_vm(api, ZONE, vm_name).metadata
    n = len(cloud.emu.model.requests)
    t, _ = _transport(cloud, _spec(cloud, project, vm_name, key_ttl=3600.0))
    try:
        posix = t.run(0, "whoami").stdout.strip()
    finally:
        t.close()
    profile = cloud.emu.model.profiles["ada@example.com"]
    assert posix == profile.user != _node(cloud, project, vm_name).workers[0].user
    mine = ensure_identity(None, cloud.notes.append)
    (key,) = profile.keys.values()
    assert key["key"] == mine.public and int(key["expirationTimeUsec"]) > 0
    assert get_vm(api, ZONE, vm_name).metadata == before  # OS Login: metadata untouched
    assert "POST /v1/users/ada%40example.com:importSshPublicKey" in cloud.calls(n)
    assert not [r for r in cloud.calls(n) if r.startswith("PATCH")]
    assert any("OS Login (enable-oslogin=TRUE): imported google_compute_engine into ada@example.com's" in x
               and f"logging in as {posix}" in x for x in cloud.notes)  # fmt: skip

    cloud.emu.admin("faults", oslogin_denied=True)
    t, _ = _transport(cloud, _spec(cloud, project, vm_name))
    with pytest.raises(PermissionDeniedError, match="OS Login refused") as e:
        t.connect(0)
    assert "roles/compute.osLogin" in e.value.line() and e.value.exit_code == 6


def test_instance_metadata_overrides_the_project_os_login(
    cloud: Cloud, project: str, vm_name: str, home: Path
) -> None:
    cloud.emu.admin("project-metadata", project=project, metadata={"enable-oslogin": "TRUE"})
    api = _api(cloud, project)
    api.call(
        "create",
        api.client.create_node,
        parent=api.parent(ZONE),
        node_id=vm_name,
        node={
            "accelerator_type": "v4-8",
            "runtime_version": RUNTIME,
            "metadata": {"enable-oslogin": "false"},
        },
    )
    wait_state(api, ZONE, vm_name, "node", "READY", 60)
    t, _ = _transport(cloud, _spec(cloud, project, vm_name))
    try:
        assert t.run(0, "true").ok
    finally:
        t.close()
    assert "ssh-keys" in get_vm(api, ZONE, vm_name).metadata
    assert any("metadata keys: added" in n for n in cloud.notes)


def _internal_only(cloud: Cloud, project: str, name: str) -> None:
    api = _api(cloud, project)
    node = {
        "accelerator_type": "v4-8",
        "runtime_version": RUNTIME,
        "network_config": {"network": "default", "enable_external_ips": False},
    }
    api.call("create", api.client.create_node, parent=api.parent(ZONE), node_id=name, node=node)
    wait_state(api, ZONE, name, "node", "READY", 60)


def test_internal_only_vm_is_reached_through_the_iap_tunnel(
    cloud: Cloud, project: str, vm_name: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _internal_only(cloud, project, vm_name)
    monkeypatch.setenv(
        "TPUOPS_GCLOUD", f"{sys.executable} -m tpuops.cloud.emulator.iap --api-endpoint {cloud.url}"
    )
    rec = _node(cloud, project, vm_name)
    t, found = _transport(cloud, _spec(cloud, project, vm_name))
    assert found.route == "iap" and found.watch_endpoints() == []
    try:
        assert t.run(0, "echo through-iap").stdout == "through-iap\n"
        (w,) = t.workers
        assert (w.host, w.internal_host) == ("127.0.0.1", "127.0.0.3") and w.port != rec.workers[0].port
    finally:
        t.close()
    assert any("no external IP; tunnelling through IAP" in n for n in cloud.notes)
    assert any(f"IAP tunnels up: w0 -> 127.0.0.1:{w.port}" in n for n in cloud.notes)
    with pytest.raises(OSError):  # the tunnel process is gone with the transport
        __import__("socket").create_connection(("127.0.0.1", w.port), timeout=2)

    # --internal-ip from outside the VPC: the internal address does not answer.
    t, found = _transport(cloud, _spec(cloud, project, vm_name, internal_ip=True))
    with pytest.raises(ConnectError, match=r"cannot connect to w0 .*127\.0\.0\.3"):
        t.connect(0)

    cloud.emu.admin("faults", iap_denied=True)
    t, _ = _transport(cloud, _spec(cloud, project, vm_name))
    with pytest.raises(PermissionDeniedError, match="IAP refused the tunnel to t1v-n-") as e:
        t.connect(0)
    assert "roles/iap.tunnelResourceAccessor" in e.value.line()

    monkeypatch.delenv("TPUOPS_GCLOUD")
    t, _ = _transport(cloud, _spec(cloud, project, vm_name, tunnel_through_iap=True))
    with monkeypatch.context() as mp, pytest.raises(ConnectError, match="the IAP tunnel needs gcloud"):
        mp.setenv("PATH", str(home))  # no gcloud anywhere (only for this call: teardown needs pkill)
        t.connect(0)


def test_two_worker_trainer_gets_worker_0_internal_ip_as_coordinator(
    cloud: Cloud, vm_name: str, tmp_path: Path
) -> None:
    from tpuops.run import launch

    create_vm(cloud.api(), CreateRequest(vm_name, "v4-16", RUNTIME, (ZONE,)))
    sop = tmp_path / "coordinator.yaml"
    sop.write_text(
        "name: coordinator\ndescription: what the trainer is given\nsteps:\n"
        "  - kind: shell\n    command: echo coordinator={coordinator_host}\n"
    )
    spec = TargetSpec(vm=vm_name, zone=ZONE, api_endpoint=cloud.url, identity=str(cloud.identity))
    report = launch.start(launch.RunRequest(str(sop), target=spec), cwd=tmp_path)
    assert isinstance(report, RunResult) and report.first_failure() is None
    said = {w: r[-1].stdout.strip() for w, r in report.steps[0].results.items()}
    assert said == {0: "coordinator=127.0.0.1", 1: "coordinator=127.0.0.1"}  # w0's internal IP ...
    workers = locate.locate_workers(spec, notify=cloud.notes.append)
    assert [w.host for w in workers] == ["127.0.0.2", "127.0.0.2"]  # ... while SSH uses the external IPs
    assert [w.internal_host for w in workers] == ["127.0.0.1", "127.0.0.1"]


def test_google_compute_engine_key_is_made_once_and_no_key_push_fails_clearly(
    cloud: Cloud, project: str, vm_name: str, home: Path
) -> None:
    key = home / ".ssh" / "google_compute_engine"
    assert not key.exists()
    create_vm(_api(cloud, project), CreateRequest(vm_name, "v4-8", RUNTIME, (ZONE,)))
    r = cloud.cli("run", "exec", "--set", "cmd=true", "--vm", vm_name, "--zone", ZONE, "--project", project,
                  "--no-key-push", "--json")  # fmt: skip
    assert r.returncode == 3, r.stderr
    assert f"generated SSH key {key} (ed25519)" in r.stderr
    made = key.read_bytes()
    assert (
        made.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----") and oct(key.stat().st_mode & 0o777) == "0o600"
    )
    assert (home / ".ssh" / "google_compute_engine.pub").read_text().startswith("ssh-ed25519 ")
    assert "is not in the VM's ssh-keys metadata and --no-key-push forbids adding it" in r.stdout
    assert "Traceback" not in r.stderr

    r = cloud.cli(
        "run", "exec", "--set", "cmd=echo hi", "--vm", vm_name, "--zone", ZONE, "--project", project
    )
    assert r.returncode == 0, r.stderr
    assert "generated SSH key" not in r.stderr and key.read_bytes() == made  # reused, never overwritten
    assert "metadata keys: added" in r.stderr


def test_tpu_api_403_names_the_role_in_one_line(cloud: Cloud, vm_name: str) -> None:
    cloud.emu.admin("faults", unavailable=1, code=403)
    r = cloud.cli("vm", "describe", vm_name, "--zone", ZONE)
    assert r.returncode == 6
    assert "roles/tpu.viewer" in r.stderr and "Traceback" not in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr


def test_default_user_is_sanitised_as_gcloud_does(monkeypatch: pytest.MonkeyPatch) -> None:
    for login, expected in (("Ada.Lovelace", "ada_lovelace"), ("1x-Y", "g1x_y"), ("a" * 40, "a" * 32)):
        monkeypatch.setenv("USER", login)
        monkeypatch.setenv("LOGNAME", login)
        assert default_user() == expected


def test_key_ttl_and_route_options_are_checked() -> None:
    from tpuops.config import target_from_options as target
    from tpuops.errors import UsageError

    assert target(vm="v", key_ttl="12h").key_ttl == 43200
    with pytest.raises(UsageError, match="--key-ttl '12 parsecs' is not a duration"):
        target(vm="v", key_ttl="12 parsecs")
    with pytest.raises(UsageError, match="--tunnel-through-iap and --internal-ip were both given"):
        locate.route_of(None, TargetSpec(vm="v", internal_ip=True, tunnel_through_iap=True), print)  # type: ignore[arg-type]


def test_an_internal_only_mig_slice_is_reached_over_iap_with_the_key_set_on_each_instance(
    cloud: Cloud, project: str, vm_name: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Compute Engine slice without external IPs: each instance is an IAP target by its own name, and the
    new google_compute_engine key goes into every instance's ssh-keys (setMetadata with its fingerprint)."""
    from tpuops.cloud import compute_create
    from tpuops.cloud.create import CreateRequest

    monkeypatch.setenv(
        "TPUOPS_GCLOUD", f"{sys.executable} -m tpuops.cloud.emulator.iap --api-endpoint {cloud.url}"
    )
    req = CreateRequest(vm_name, "tpu7x-16", "", (ZONE,), wait=True, timeout=60, internal_ips=True)
    compute_create.create_vm(_api(cloud, project), req)
    t, found = _transport(cloud, _spec(cloud, project, vm_name))
    assert (found.route, found.vm.kind, found.watch_endpoints()) == ("iap", "mig", [])
    try:
        assert [t.run(w, "echo through-iap").stdout for w in (0, 1)] == ["through-iap\n"] * 2
    finally:
        t.close()
    blob = " ".join((home / ".ssh" / "google_compute_engine.pub").read_text().split()[:2])
    compute = cloud.emu.model.compute
    for name in found.vm.instances:
        md = compute.instances[f"projects/{project}/zones/{ZONE}/instances/{name}"].body["metadata"]
        assert blob in md["ssh-keys"] and md["agent-worker-number"] in ("0", "1")  # other keys kept
    assert any(
        n.startswith(f"{vm_name}: IAP tunnels up: w0 -> 127.0.0.1:") and ", w1 -> " in n for n in cloud.notes
    )


def test_os_login_reaches_a_compute_engine_instance_without_touching_its_metadata(
    cloud: Cloud, project: str, vm_name: str, home: Path
) -> None:
    """The same OS Login path for a Compute Engine TPU VM: the project's enable-oslogin, the key imported into
    the account's profile, the login as its POSIX user, no setMetadata."""
    from tpuops.cloud import compute_create

    gcloud = Path(os.environ["CLOUDSDK_CONFIG"]) / "configurations"
    gcloud.mkdir(parents=True)
    (gcloud / "config_default").write_text("[core]\naccount = grace@example.com\n")
    cloud.emu.admin("project-metadata", project=project, metadata={"enable-oslogin": "TRUE"})
    compute_create.create_vm(_api(cloud, project), CreateRequest(vm_name, "tpu7x-8", "", (ZONE,), wait=True))
    n = len(cloud.emu.model.requests)
    t, found = _transport(cloud, _spec(cloud, project, vm_name))
    try:
        posix = t.run(0, "whoami").stdout.strip()
    finally:
        t.close()
    assert found.vm.api == "compute" and posix == cloud.emu.model.profiles["grace@example.com"].user
    assert "POST /v1/users/grace%40example.com:importSshPublicKey" in cloud.calls(n)
    assert not [c for c in cloud.calls(n) if c.endswith("/setMetadata")]
