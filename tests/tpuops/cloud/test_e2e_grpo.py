"""`tpuops run grpo` on emulated TPU VMs: real sshd workers, real git, the trainer on CPU, multi-host JAX."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.data import DATA
from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud.emulator.sshd import free_port

REPO = Path(__file__).resolve().parents[3]
ZONE = "us-east1-d"


@pytest.mark.slow
@pytest.mark.parametrize(("accelerator", "workers"), [("v4-8", 1), ("v4-16", 2)])
def test_run_grpo_on_an_emulated_vm(
    cloud: Cloud,
    vm_name: str,
    worker_python: str,
    committed_repo: Path,
    tmp_path: Path,
    accelerator: str,
    workers: int,
) -> None:
    created = cloud.cli(
        "vm", "create", vm_name, "--type", accelerator, "--zone", ZONE, "--runtime-version", "base"
    )
    assert created.returncode == 0, created.stderr
    head = subprocess.run(
        ["git", "-C", str(committed_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    # The smallest GRPO step of the tiny model (2 prompts x 2 samples, 8 new tokens, one micro-batch): each
    # worker's trainer costs its own compiles and steps, and what is checked here is the run, not its size.
    sets = {
        "repo_url": str(committed_repo), "branch": head.stdout.strip(), "venv": "none", "python": worker_python,
        "data_dir": str(DATA), "steps": "2", "lockfile": "~/libtpu_lockfile", "coordinator_port": str(free_port()),
        "config": "tiny", "train.prompts_per_step": "2", "rollout.samples_per_prompt": "2",
        "rollout.max_new_tokens": "8", "train.micro_batch": "4", "log.output_dir": "~/trainer-out",
    }  # fmt: skip
    data = cloud.run_grpo(vm_name, ZONE, sets, tmp_path)
    assert data["workers"] == list(range(workers))
    log = data["log"]
    assert log["steps"] == 2 and not log["failures"]
    assert log["start"]["process_count"] == str(workers)  # every worker joined one jax.distributed group
    assert log["exit_codes"] == {str(w): 0 for w in range(workers)}
    shas = {w["sha"] for w in data["steps"][0]["workers"].values()}
    assert shas == {head.stdout.strip()[:7]}
    # `tpuops top`: every worker asked at once; on CPU the memory fields are absent and the command says so.
    top = cloud.cli("top", data["run_id"], "--json", cwd=tmp_path)
    assert top.returncode == 0, top.stderr
    snap = json.loads(top.stdout)
    assert [w["worker"] for w in snap["workers"]] == list(range(workers))
    assert all(w["state"] == "exited 0" for w in snap["workers"]), snap
    assert snap["workers"][0]["step"] == 1 and snap["workers"][0]["chips"] is None
    assert snap["memory_fields"] is False and "memory fields absent" in snap["note"]
    people = cloud.cli("top", data["run_id"], cwd=tmp_path)  # the job has ended: one snapshot, then exit
    assert people.returncode == 0, people.stderr
    assert "memory fields absent" in people.stderr and all(f"w{w}" in people.stderr for w in range(workers))
