"""JAX's persistent compilation cache on an emulated VM: on by default, in the repository's home on the worker; a
second identical run reads its programs from it, and the report says how many."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.data import DATA
from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud.emulator.sshd import free_port
from tpuops.run.tree import repo_home

ZONE = "us-east1-d"


@pytest.mark.slow
def test_a_second_identical_run_reads_its_compiles_from_the_default_cache(
    cloud: Cloud, vm_name: str, worker_python: str, committed_repo: Path, tmp_path: Path
) -> None:
    created = cloud.cli(
        "vm", "create", vm_name, "--type", "v4-8", "--zone", ZONE, "--runtime-version", "base"
    )
    assert created.returncode == 0, created.stderr
    (rec,) = [rec for n, rec in cloud.emu.model.nodes.items() if n.endswith(f"/nodes/{vm_name}")]
    # The suite's own session cache reaches every worker session (tests/conftest.py, sshd's SetEnv): the .env
    # empties it, so `compile_cache=auto` (the default) takes its own folder, new for this worker and repository.
    (tmp_path / ".env").write_text("JAX_COMPILATION_CACHE_DIR=\n")
    cache = Path(str(rec.workers[0].home) + repo_home(str(committed_repo))[1:]) / "jax-cache"
    assert not cache.exists()
    head = subprocess.run(
        ["git", "-C", str(committed_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    sets = {
        "repo_url": str(committed_repo), "branch": head, "venv": "none", "python": worker_python,
        "data_dir": str(DATA), "steps": "2", "lockfile": "~/libtpu_lockfile", "coordinator_port": str(free_port()),
        "config": "tiny", "train.prompts_per_step": "2", "rollout.samples_per_prompt": "2",
        "rollout.max_new_tokens": "8", "train.micro_batch": "4", "log.output_dir": "~/trainer-out",
    }  # fmt: skip
    first = cloud.run_grpo(vm_name, ZONE, sets, tmp_path)["log"]
    assert first["summary"]["compile_cache_hits"] == 0 and first["compile_cache"]["hits"] == 0
    assert any(cache.iterdir())  # the first run's programs were written beside its checkout
    second = cloud.run_grpo(vm_name, ZONE, sets, tmp_path)["log"]
    hits = second["compile_cache"]["hits"]
    assert hits > 0 and second["compile_cache"]["saved_s"] > 0, second["summary"]
    # Step 0 holds the compiles: read from the cache it takes at most 0.6 of the first run's.
    dt0 = [run["rows"][0]["dt"] for run in (first, second)]
    assert dt0[1] <= 0.6 * dt0[0], dt0
    # A recompile check of the same shapes reads the same cache: every compile is still logged (a cache hit
    # logs `Compiling ...` too), none after the warm-up, and the report names the hits.
    check = cloud.cli(
        "run", "recompile-check", "--vm", vm_name, "--zone", ZONE, "--identity", str(cloud.identity),
        "--skip-fit", *(a for k, v in sets.items() for a in ("--set", f"{k}={v}")), cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr[-3000:]
    assert "compile cache: " in check.stderr and " from the persistent cache, " in check.stderr, check.stderr
    assert "0 after warm-up" in check.stderr
