"""Multislice against the emulator: one queued resource with multislice parameters, its slices' workers as one
target in slice order, MEGASCALE_* on every worker, and a preemption of any slice recovering the whole."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.data import DATA
from tests.tpuops.cloud.conftest import Cloud
from tests.tpuops.cloud.test_recovery import ZONE, _preempt_after, _recover_smoke
from tpuops.cloud.emulator.sshd import free_port
from tpuops.sop.model import MEGASCALE_PORT, PlanContext


def _json(r: subprocess.CompletedProcess[str]) -> dict:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _create(cloud: Cloud, name: str) -> dict:
    made = cloud.cli(
        "vm", "create", name, "--type", "v4-16", "--slices", "2", "--zone", ZONE,
        "--runtime-version", "base", "--spot", "--wait", "--json",
    )  # fmt: skip
    return _json(made)["vm"]


def test_a_two_slice_vm_is_one_target_and_each_worker_gets_its_slice(cloud: Cloud, vm_name: str) -> None:
    vm = _create(cloud, vm_name)
    assert (vm["state"], vm["worker_count"]) == ("READY", 4)
    assert vm["slices"] == [f"{vm_name}-0", f"{vm_name}-1"]
    qr = cloud.emu.model.qrs[f"projects/tpuops-emulator/locations/{ZONE}/queuedResources/{vm_name}"]
    (spec,) = qr["tpu"]["nodeSpec"]  # what the client put on the wire: the v2 API's multislice parameters
    assert spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": vm_name} and "nodeId" not in spec
    nodes = {k.rsplit("/", 1)[1]: rec for k, rec in cloud.emu.model.nodes.items() if vm_name in k}
    assert sorted(nodes) == [f"{vm_name}-0", f"{vm_name}-1"]

    described = _json(cloud.cli("vm", "describe", vm_name, "--json"))["vm"]  # no --zone: searched
    assert [(w["index"], w["slice"]) for w in described["workers"]] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    table = cloud.cli("vm", "describe", vm_name, "--zone", ZONE)
    assert f"2: {vm_name}-0, {vm_name}-1" in table.stderr and "slice 1" in table.stderr

    cmd = "echo $MEGASCALE_SLICE_ID $MEGASCALE_NUM_SLICES $MEGASCALE_COORDINATOR_ADDRESS $MEGASCALE_PORT"
    ran = cloud.cli(
        "run", "exec", "--vm", vm_name, "--identity", str(cloud.identity), "--set", f"cmd={cmd}", "--json"
    )
    report = _json(ran)
    (step,) = [s for s in report["steps"] if s["kind"] == "shell"]
    # Workers in slice order: slice 0's two, then slice 1's; the coordinator is slice 0's worker 0.
    said = [step["workers"][str(i)]["detail"].split() for i in range(4)]
    assert [s[0] for s in said] == ["0", "0", "1", "1"]
    assert {(s[1], s[2], s[3]) for s in said} == {("2", "127.0.0.1", str(MEGASCALE_PORT))}
    # The users behind each worker are the slices' own, in slice order.
    whoami = _json(cloud.cli("run", "exec", "--vm", vm_name, "--identity", str(cloud.identity),
                             "--set", "cmd=whoami", "--json"))  # fmt: skip
    (step,) = [s for s in whoami["steps"] if s["kind"] == "shell"]
    users = [w.user for n in (f"{vm_name}-0", f"{vm_name}-1") for w in nodes[n].workers]
    assert [step["workers"][str(i)]["detail"] for i in range(4)] == users

    deleted = _json(cloud.cli("vm", "delete", vm_name, "--yes", "--json"))
    assert deleted["name"] == vm_name
    assert not [k for k in cloud.emu.model.nodes if vm_name in k] and not cloud.emu.model.qrs


def test_one_slice_has_no_megascale_variables() -> None:
    one = PlanContext(worker=0, num_workers=2, run_id="r", values={})
    assert one.megascale_env() == {}
    two = PlanContext(0, 4, "r", {}, coordinator_host="10.0.0.2", slice_id=1, num_slices=2)
    assert two.megascale_env() == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2", "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_PORT": str(MEGASCALE_PORT),
    }  # fmt: skip


def test_a_preempted_slice_recreates_the_whole_multislice_and_the_run_finishes(
    cloud: Cloud, vm_name: str, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    _create(cloud, vm_name)
    parent = f"projects/tpuops-emulator/locations/{ZONE}"
    slice1 = f"{parent}/nodes/{vm_name}-1"
    slice0_before = cloud.emu.model.nodes[f"{parent}/nodes/{vm_name}-0"]
    lines: list[str] = []
    events: list[str] = []
    killer = _preempt_after(cloud, slice1, lines, 5)
    report = _recover_smoke(cloud, vm_name, git_remote[0], tmp_path, lines, events, max_recoveries=2)
    killer.join()
    assert report.ok, report.first_failure()
    assert len(report.recoveries) == 1
    assert any("PREEMPTED" in e for e in events) and any("READY again" in e for e in events)
    # Both slices were made again (slice 0 too: its workers are new), under the same queued resource.
    for i in (0, 1):
        assert cloud.emu.model.nodes[f"{parent}/nodes/{vm_name}-{i}"].state == "READY"
    assert cloud.emu.model.qrs[f"{parent}/queuedResources/{vm_name}"]["state"] == {"state": "ACTIVE"}
    assert cloud.emu.model.nodes[f"{parent}/nodes/{vm_name}-0"] is not slice0_before
    assert "step=29 " in "\n".join(lines)


def test_the_default_job_runs_across_two_slices_of_two_workers(
    cloud: Cloud, vm_name: str, worker_python: str, committed_repo: Path, tmp_path: Path
) -> None:
    """`run grpo` on 2 x v4-16: 4 trainer processes in one jax.distributed group, the mesh's dcn axis over the
    slices (MEGASCALE_NUM_SLICES from the run step), exit 0 on every worker."""
    _create(cloud, vm_name)
    head = subprocess.run(
        ["git", "-C", str(committed_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    # The smallest step four processes share: a prompt each (prompts_per_step is a multiple of the process
    # count), 2 samples of 8 new tokens, one micro-batch of 8 sequences over the 4 devices (2 each). Each of the
    # four trainers costs its own compiles and steps, so nothing bigger than the mesh needs.
    sets = {
        "repo_url": str(committed_repo), "branch": head, "venv": "none", "python": worker_python,
        "data_dir": str(DATA), "steps": "1", "lockfile": "~/libtpu_lockfile", "coordinator_port": str(free_port()),
        "config": "tiny", "train.prompts_per_step": "4", "rollout.samples_per_prompt": "2",
        "rollout.max_new_tokens": "8", "train.micro_batch": "8", "log.output_dir": "~/trainer-out",
    }  # fmt: skip
    log = cloud.run_grpo(vm_name, ZONE, sets, tmp_path)["log"]
    assert log["steps"] == 1 and not log["failures"]
    assert log["start"]["process_count"] == "4"
    assert log["start"]["mesh"] == "dcn:2,dp:1,fsdp:2,tp:1"
    assert log["exit_codes"] == {str(w): 0 for w in range(4)}


@pytest.mark.parametrize("slices", ["1000", "0", "257"])
def test_slices_beyond_what_google_offers_are_refused_before_any_request(
    cloud: Cloud, vm_name: str, slices: str
) -> None:
    before = len(cloud.calls())
    r = cloud.cli(
        "vm", "create", vm_name, "--type", "v4-16", "--slices", slices, "--zone", ZONE, "--runtime-version", "base"
    )  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"--slices must be 1 to 256, received {slices}" in r.stderr
    assert cloud.calls(before) == []  # nothing asked of the API
