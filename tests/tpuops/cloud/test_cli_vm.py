"""`tpuops vm`, `tpuops emulator` and `tpuops sop run --vm` as users call them, against the emulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.tpuops.cloud.conftest import Cloud
from tpuops.cli import complete
from tpuops.errors import ExitCode
from tpuops.run.tree import repo_home


def _json(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def test_vm_lifecycle_and_a_sop_on_a_two_worker_vm(cloud: Cloud, vm_name: str) -> None:
    key = f"{cloud.identity}.pub"
    create = ["vm", "create", vm_name, "--type", "v4-16", "--zone", "us-east5-a", "--runtime-version", "base"]
    created = cloud.cli(*create, "--ssh-public-key", key, "--wait", "--json")
    assert created.returncode == 0, created.stderr
    vm = _json(created)["vm"]
    assert (vm["state"], vm["worker_count"], vm["zone"]) == ("READY", 2, "us-east5-a")

    listed = _json(cloud.cli("vm", "list", "--json"))
    assert len(listed["zones_searched"]) == 4
    assert [v["name"] for v in listed["vms"] if v["name"] == vm_name] == [vm_name]
    # What TAB offers after it (tests/tpuops/test_complete.py: through bash), with no API call on TAB.
    assert (vm_name, "v4-16 in us-east5-a") in complete.vm_names(vm_name[:3])
    assert "us-east5-a" in [z for z, _ in complete.zones("us-")]

    described = _json(cloud.cli("vm", "describe", vm_name, "--json"))["vm"]  # no --zone: searched
    assert [(w["internal_ip"], w["external_ip"]) for w in described["workers"]] == [
        ("127.0.0.1", "127.0.0.2")
    ] * 2

    ran = cloud.cli(
        "sop",
        "run",
        "exec",
        "--vm",
        vm_name,
        "--identity",
        str(cloud.identity),
        "--set",
        "cmd=whoami",
        "--json",
    )
    assert ran.returncode == 0, ran.stderr
    report = _json(ran)
    users = [w.user for w in next(r for k, r in cloud.emu.model.nodes.items() if k.endswith(vm_name)).workers]
    (step,) = report["steps"]
    assert report["ok"] and sorted(step["workers"]) == ["0", "1"]
    assert [step["workers"][str(i)]["detail"] for i in (0, 1)] == users

    refused = cloud.cli("vm", "delete", vm_name)
    assert refused.returncode == ExitCode.USAGE and "pass --yes" in refused.stderr
    deleted = _json(cloud.cli("vm", "delete", vm_name, "--yes", "--json"))
    assert deleted == {"ok": True, "action": "deleted", "name": vm_name, "zone": "us-east5-a"}
    gone = _json(cloud.cli("vm", "wait", vm_name, "--zone", "us-east5-a", "--state", "DELETED", "--json"))
    assert gone["state"] == "DELETED"


def test_errors_exit_codes_and_json(cloud: Cloud, vm_name: str) -> None:
    created = cloud.cli(
        "vm", "create", vm_name, "--type", "v4-8", "--zone", "us-east1-d", "--runtime-version", "r"
    )
    assert created.returncode == 0, created.stderr
    missing = cloud.cli("vm", "describe", vm_name[:-1] + "z", "--json")
    assert missing.returncode == ExitCode.CLOUD
    err = _json(missing)
    assert err["error"] == "cloud" and f"did you mean {vm_name} (us-east1-d)?" in err["message"]

    preempt = cloud.cli("emulator", "fault", "preempt", vm_name, "--json")
    assert (
        _json(preempt)["nodes"][f"projects/tpuops-emulator/locations/us-east1-d/nodes/{vm_name}"]
        == "PREEMPTED"
    )
    sop = cloud.cli("sop", "run", "exec", "--vm", vm_name, "--set", "cmd=true", "--json")
    assert sop.returncode == ExitCode.PREEMPTED
    assert _json(sop)["error"] == "preempted" and "recreate it" in _json(sop)["message"]
    waited = cloud.cli("vm", "wait", vm_name, "--state", "READY", "--timeout", "5")
    assert waited.returncode == ExitCode.PREEMPTED and "was preempted" in waited.stderr

    cloud.cli("emulator", "fault", "capacity", "*", "--count", "2")
    full = cloud.cli(
        "vm",
        "create",
        vm_name + "b",
        "--type",
        "v6e-8",
        "--zone",
        "us-east1-d",
        "--zone",
        "us-central1-a",
        "--runtime-version",
        "r",
    )
    assert full.returncode == ExitCode.CLOUD
    assert "no capacity for v6e-8 in us-east1-d, us-central1-a" in full.stderr


def test_serve_prints_the_export_line_applies_faults_and_stops_cleanly(tmp_path: Path) -> None:
    state = tmp_path / "emu"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tpuops",
            "emulator",
            "serve",
            "--state-dir",
            str(state),
            "--unavailable",
            "1",
            "--zone",
            "us-east1-d",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert line.startswith("export TPUOPS_TPU_API=http://127.0.0.1:")
        url = line.split("=", 1)[1]
        env = {**os.environ, "TPUOPS_TPU_API": url}
        run = [sys.executable, "-m", "tpuops"]
        listed = subprocess.run(
            [*run, "vm", "list", "--json"], check=False, capture_output=True, text=True, env=env, timeout=60
        )
        assert listed.returncode == 0, listed.stderr
        assert _json(listed) == {"ok": True, "zones_searched": ["us-east1-d"], "vms": []}
        assert "503 The service is currently unavailable.; retry 1/5" in listed.stderr
        created = subprocess.run(
            [
                *run,
                "vm",
                "create",
                "x1",
                "--type",
                "v4-8",
                "--zone",
                "us-east1-d",
                "--runtime-version",
                "r",
                "--json",
            ],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr  # the emulator's own key is the default authorized key
        ran = subprocess.run(
            [
                *run,
                "sop",
                "run",
                "exec",
                "--vm",
                "x1",
                "--identity",
                str(state / "client" / "id_ed25519"),
                "--set",
                "cmd=echo hi",
                "--json",
            ],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert ran.returncode == 0, ran.stderr
        assert _json(ran)["steps"][0]["workers"]["0"]["detail"] == "hi"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    (stopping,) = [ln for ln in proc.stderr.read().splitlines() if "stopping:" in ln]  # type: ignore[union-attr]
    assert stopping.startswith("tpuops: stopping: the API server, 1 VM and their sshd workers, ")
    assert stopping.endswith(f"(state kept in {state})")
    sshd_pids = list(state.glob("nodes/*/w*/sshd.pid"))
    assert sshd_pids, "the VM had an sshd"
    for pidfile in sshd_pids:
        assert not Path(f"/proc/{pidfile.read_text().strip()}").exists()


def test_sync_sop_over_vm_checks_out_the_repo_on_every_worker(
    cloud: Cloud, vm_name: str, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    bare, sha = git_remote
    create = [
        "vm",
        "create",
        vm_name,
        "--type",
        "v4-16",
        "--zone",
        "us-central1-a",
        "--runtime-version",
        "base",
    ]
    assert cloud.cli(*create).returncode == 0
    sync = [
        "sop",
        "run",
        "sync",
        "--vm",
        vm_name,
        "--zone",
        "us-central1-a",
        "--identity",
        str(cloud.identity),
    ]
    ran = cloud.cli(*sync, "--set", f"repo_url={bare}", "--set", "lockfile=~/lock", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert _json(ran)["ok"]
    rec = next(r for k, r in cloud.emu.model.nodes.items() if k.endswith(f"/{vm_name}"))
    checkout = repo_home(str(bare)).removeprefix("~/") + "/checkout"  # the repository's own home on a worker
    for w in rec.workers:
        head = subprocess.run(
            ["git", "-c", "safe.directory=*", "-C", str(w.home / checkout), "rev-parse", "HEAD"],
            check=True,
            capture_output=True,
            text=True,
        )
        assert head.stdout.strip() == sha


def test_bad_names_are_exit_2_before_any_call_and_no_line_carries_a_url(cloud: Cloud, vm_name: str) -> None:
    """A size the family has not, an unknown family: exit 2 naming the sizes / families, no request made. An
    unknown zone: exit 2 with the emulator's own zone as the did-you-mean. A zone the emulator does not serve:
    one line naming the zones that offer the type; no line shows the endpoint's URL."""
    base = ["vm", "create", vm_name, "--zone", "us-east1-d", "--runtime-version", "base"]
    before = len(cloud.emu.model.requests)
    size = cloud.cli(*base, "--accelerator", "v4-7")
    family = cloud.cli(*base, "--accelerator", "v9z-8")
    assert (size.returncode, family.returncode) == (ExitCode.USAGE, ExitCode.USAGE)
    assert "did you mean v4-8? v4 sizes: 8, 16, 32" in size.stderr
    assert "v2, v3, v4, v5p, v5litepod, v5e, v6e, tpu7x" in family.stderr
    assert len(cloud.emu.model.requests) == before, cloud.calls(before)

    zone = cloud.cli("vm", "create", vm_name, "--accelerator", "v4-8", "--zone", "us-east1-x",
                     "--runtime-version", "base")  # fmt: skip
    assert zone.returncode == ExitCode.USAGE and "did you mean us-east1-d" in zone.stderr, zone.stderr
    offered = cloud.cli("vm", "create", vm_name, "--accelerator", "v4-8", "--zone", "us-central1-c",
                        "--runtime-version", "base")  # fmt: skip
    assert offered.returncode == ExitCode.CLOUD
    # The test emulator's zones (none of them the table's v4 zones): the zones of this API are named.
    assert (
        "v4-8 is not offered in us-central1-c; zones that offer it: europe-west4-a, us-central1-a"
        in offered.stderr
    )
    listed = cloud.cli("vm", "list", "--zone", "us-east1-x")
    assert listed.returncode == ExitCode.USAGE
    for r in (size, family, zone, offered, listed):
        assert "http://" not in r.stderr and "googleapis" not in r.stderr, r.stderr


def test_describe_of_a_missing_name_lists_the_compute_engine_vms_of_the_zone(
    cloud: Cloud, vm_name: str
) -> None:
    made = cloud.cli("vm", "create", vm_name, "--accelerator", "tpu7x-8", "--zone", "us-east5-a")
    assert made.returncode == 0, made.stderr
    missing = cloud.cli("vm", "describe", "zzz-absent", "--zone", "us-east5-a")
    assert missing.returncode == ExitCode.CLOUD
    assert f"{vm_name} (Compute Engine instance)" in missing.stderr, missing.stderr
