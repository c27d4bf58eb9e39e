"""`tpuops profile RUN_ID --worker all` on a running 2-worker job of an emulated TPU VM: each worker's profiler
server reached on its own loopback through its SSH connection (SshTransport.open_tcp), the traces brought into
the run folder, and the job left to end as it would have."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.data import DATA
from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud.emulator.sshd import free_port

ZONE = "us-east1-d"
# The two captures took the time of ~27 steps of ~1 s on a loaded 2-core machine (2026-11-29); on a quiet one the
# job's 60 steps can end as the second capture does. Each capture reads the trainers' own profiler servers, so its
# ops prove the job ran through it; the job then ends as it would have.
STEPS = 60


def two_free_ports() -> int:
    """A port P with P + 1 free too: worker k's trainer serves on P + k (both workers share this host)."""
    for _ in range(50):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise AssertionError("no two consecutive free ports")


@pytest.mark.slow
def test_profile_every_worker_of_a_running_job_on_an_emulated_vm(
    cloud: Cloud, vm_name: str, worker_python: str, committed_repo: Path, tmp_path: Path
) -> None:
    created = cloud.cli(
        "vm", "create", vm_name, "--type", "v4-16", "--zone", ZONE, "--runtime-version", "base"
    )
    assert created.returncode == 0, created.stderr
    head = subprocess.run(
        ["git", "-C", str(committed_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    sets = {
        "repo_url": str(committed_repo), "branch": head, "venv": "none", "python": worker_python,
        "data_dir": str(DATA), "steps": str(STEPS), "lockfile": "~/libtpu_lockfile",
        "coordinator_port": str(free_port()), "profile_port": str(two_free_ports()),
        "config": "tiny", "train.prompts_per_step": "2", "rollout.samples_per_prompt": "2",
        "rollout.max_new_tokens": "8", "train.micro_batch": "4", "log.output_dir": "~/trainer-out",
    }  # fmt: skip
    args = [
        "run",
        "grpo",
        "--vm",
        vm_name,
        "--zone",
        ZONE,
        "--identity",
        str(cloud.identity),
        "--json",
        "--skip-fit",
    ]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    env = {**os.environ, "TPUOPS_TPU_API": cloud.url, "COLUMNS": "200"}
    run = subprocess.Popen(
        [sys.executable, "-m", "tpuops", *args],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    assert run.stderr is not None and run.stdout is not None
    seen: list[str] = []
    started = threading.Event()

    def drain() -> None:  # the run's people output, read to its end so the follower never blocks on a pipe
        assert run.stderr is not None
        for line in run.stderr:
            seen.append(line)
            if "[w0] step=3 " in line:
                started.set()
        started.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert started.wait(400) and run.poll() is None, "".join(seen[-40:])
        runs = json.loads(cloud.cli("runs", "--json", cwd=tmp_path).stdout)
        run_id = str(runs[0]["run_id"])
        r = cloud.cli(
            "profile", run_id, "--seconds", "3", "--worker", "all", "--json", cwd=tmp_path, timeout=300
        )
        assert r.returncode == 0, r.stderr[-3000:]
        data = json.loads(r.stdout)
        assert sorted(data["workers"]) == ["0", "1"] and not data["errors"]
        for w, got in data["workers"].items():
            assert got["xplane_bytes"] > 1024, w
            assert len(got["ops"]) >= 3 and all(0 < op["share"] <= 1 for op in got["ops"]), got["ops"]
            folder = Path(got["folder"])
            assert folder.is_relative_to(Path(os.environ["TPUOPS_HOME"]) / "runs" / run_id / "profile")
            assert list(folder.glob(f"plugins/profile/*/w{w}.xplane.pb"))
            assert (folder / "trace.json.gz").stat().st_size > 1024
        people = cloud.cli("profile", run_id, "--seconds", "2", "--worker", "all", cwd=tmp_path, timeout=300)
        assert people.returncode == 0, people.stderr[-3000:]
        shares = [
            ln for ln in people.stderr.splitlines() if ln.rstrip().endswith(tuple("0123456789")) and "%" in ln
        ]
        assert len(shares) >= 6 and "[w0] trace" in people.stderr and "[w1] trace" in people.stderr, (
            people.stderr
        )
        # The job goes on and ends as it would have. Its JSON is read from stdout alone: stderr has its own reader
        # (`drain`), and communicate() reading it too could block there while the job blocked writing a JSON
        # larger than the pipe holds (150 steps did, 2026-11-30).
        out = run.stdout.read()
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    reader.join(10)
    assert run.returncode == 0, "".join(seen[-40:])
    ended = json.loads(out)
    assert ended["run_id"] == run_id and ended["log"]["steps"] == STEPS and not ended["log"]["failures"]
    assert ended["log"]["exit_codes"] == {"0": 0, "1": 0}
