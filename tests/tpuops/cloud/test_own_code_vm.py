"""`tpuops recompile-check --vm NAME -- CMD` on an emulated two-worker TPU VM (the TPU API emulator, real sshd
workers): the user's own repository (tests/tpuops/test_own_code.py) and command, a real jax.jit recompile, exit
7 naming its step on both workers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tests.tpuops.cloud.vms import create_vm, tpuops
from tests.tpuops.test_own_code import user_repo  # noqa: F401 - the fixture: a user's checkout with its origin


@pytest.mark.slow
def test_recompile_check_of_the_users_command_on_a_two_worker_vm(
    cloud: Cloud,
    vm_name: str,
    user_repo: Path,  # noqa: F811 - the fixture imported above
    worker_python: str,
    tmp_path: Path,
) -> None:
    vm = create_vm(cloud, vm_name, "v4-16", {}, tmp_path)
    py = Path(worker_python)
    cmd = [py.name, "-u", "scripts/train.py", "--config", "configs/small.yaml", "--set", "style=bracket"]
    r = tpuops(
        cloud,
        ["recompile-check", *vm.target(), "--json", "--set", f"python={py}", "--set", "lockfile=~/libtpu_lockfile",
         "--set", "env=JAX_PLATFORMS=cpu", "--", *cmd, "--set", "recompile_at=3"],
        user_repo,
    )  # fmt: skip
    assert r.returncode == 7, r.stderr[-4000:]
    data = json.loads(r.stdout)
    assert data["sop"] == "recompile-check-job" and data["workers"] == [0, 1]
    assert [c["step"] for c in data["log"]["recompiles"]] == [3, 3] and data["log"]["steps"] == 5
    # `--set python=/path` alone: that interpreter as it is, its bin/ first on PATH (the command names it).
    env = next(s for s in data["steps"] if s["kind"] == "python_env")
    assert {w["env"] for w in env["workers"].values()} == {"python"}
    # The repository and commit are this checkout's origin and pushed HEAD.
    head = subprocess.run(
        ["git", "-C", str(user_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    sync = next(s for s in data["steps"] if s["kind"] == "git_sync")
    assert {w["sha"] for w in sync["workers"].values()} == {head.stdout.strip()[:7]}
    local = Path(os.environ["TPUOPS_HOME"]) / "runs" / data["run_id"]
    assert "[step 4]" in (local / "worker-1.log").read_text()  # both workers ran the user's command
