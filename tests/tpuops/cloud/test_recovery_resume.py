"""--recover of a GRPO run: preempted mid-run, recreated, resumed from its checkpoint (a shared folder or gs://),
and ending with the parameters of the same run without a break; a recovery that could not resume says so first."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.data import DATA, PACED_TOKENIZER
from tests.gcs import BUCKET, gcs_server
from tests.tpuops.cloud.conftest import Cloud
from tests.tpuops.cloud.test_recovery import ZONE, _preempt_after, _vm, _worker_line
from tpuops.cloud.emulator.sshd import free_port
from tpuops.config import TargetSpec
from tpuops.run import launch, recover

# 12 toy GRPO steps with a checkpoint every 4 and the final parameters' digest printed; 2 prompts x 4 samples
# in one micro-batch. Three trainer runs read this (the uninterrupted one, the preempted one, the resumed one):
# a checkpoint before the preemption and steps after the resume are all the check needs. On PACED_TOKENIZER's
# vocabulary, so the preemption lands mid-run (tests/data.py).
TRAINER = {
    "train.steps": "12", "checkpoint.every": "4", "log.param_digest": "true", "rollout.samples_per_prompt": "4",
    "train.micro_batch": "8", "model.tokenizer": PACED_TOKENIZER,
}  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted_digest(tmp_path_factory: pytest.TempPathFactory, committed_repo: Path) -> str:
    """The digest of the same trainer, config and seed run without a break, here (one process, one CPU
    device): run once for both stores. From a clone of the commit the workers run, not this working tree (an
    uncommitted change to the trainer or its presets would compare two different programs)."""
    out = tmp_path_factory.mktemp("uninterrupted")
    tree = out / "tree"
    subprocess.run(["git", "clone", "-q", str(committed_repo), str(tree)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINER_", "XLA_"))}
    env.update(JAX_PLATFORMS="cpu")
    argv = [sys.executable, "-m", "trainer.main", "--config", "toy"]
    sets = {
        **TRAINER,
        "checkpoint.dir": str(out / "ckpt"),
        "log.output_dir": str(out / "out"),
        "data.root": str(DATA),
    }
    for k, v in sets.items():
        argv += ["--set", f"{k}={v}"]
    whole = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, timeout=300, check=False)
    assert whole.returncode == 0, whole.stderr[-3000:]
    summary = json.loads(next(ln for ln in whole.stdout.splitlines() if ln.startswith("summary: "))[9:])
    return summary["param_digest"]


@pytest.mark.slow
@pytest.mark.parametrize("store", ["shared-dir", "gs"])
def test_preempted_grpo_run_resumes_from_its_checkpoint_with_the_uninterrupted_parameters(
    store: str,
    cloud: Cloud,
    vm_name: str,
    committed_repo: Path,
    worker_python: str,
    tmp_path: Path,
    uninterrupted_digest: str,
) -> None:
    """12 toy GRPO steps, a checkpoint every 4, preempted at step ~5: recreated, resumed at 4, the same end.

    The checkpoint lives off the VM: a folder every worker user may write, or gs:// on a local GCS-compatible
    server (its address reaches the workers' jobs through .env as STORAGE_EMULATOR_HOST)."""
    with contextlib.ExitStack() as stack:
        digest = _resume_after_preemption(
            store, stack, cloud, vm_name, committed_repo, worker_python, tmp_path
        )
    assert digest == uninterrupted_digest  # the recovered run ends with the uninterrupted run's parameters


def _resume_after_preemption(
    store: str,
    stack: contextlib.ExitStack,
    cloud: Cloud,
    vm_name: str,
    committed_repo: Path,
    worker_python: str,
    tmp_path: Path,
) -> str:
    """The recovered run's final parameter digest."""
    node = _vm(cloud, vm_name, "v4-8")
    ckpt = Path(tempfile.mkdtemp(prefix="tpuops-ckpt-"))
    ckpt.chmod(0o1777)
    stack.callback(subprocess.run, ["rm", "-rf", str(ckpt)], check=False)
    ckpt_dir, env = str(ckpt / "run"), {}  # no env_file named: none is sent
    if store == "gs":
        url = stack.enter_context(gcs_server())
        ckpt_dir, env_file = f"gs://{BUCKET}/{vm_name}", tmp_path / ".env"
        env_file.write_text(f"STORAGE_EMULATOR_HOST={url}\n")
        env = {"env_file": str(env_file)}
    head = subprocess.run(
        ["git", "-C", str(committed_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    trainer = {**TRAINER, "checkpoint.dir": ckpt_dir, "log.output_dir": "~/trainer-out"}
    sets = {
        "repo_url": str(committed_repo), "branch": head.stdout.strip(), "venv": "none", "python": worker_python,
        "data_dir": str(DATA), "config": "toy", "steps": "12", "lockfile": "~/libtpu_lockfile",
        "coordinator_port": str(free_port()), **env, **trainer,
    }  # fmt: skip
    spec = TargetSpec(vm=vm_name, zone=ZONE, api_endpoint=cloud.url, identity=str(cloud.identity))
    lines: list[str] = []
    killer = _preempt_after(cloud, node, lines, 6, within=300)  # after step=5 (set-up and compiles first)
    report = launch.start(
        launch.RunRequest(sop="grpo", sets=sets, target=spec, skip_fit=True),  # CPU workers: test_fit.py
        max_recoveries=1,
        watch_s=0.2,
        ready_timeout=120,
        on_line=_worker_line(lines),
        cwd=tmp_path,
    )
    killer.join()  # at once when the job died before its sixth step
    assert report.ok, "\n".join([str(report.first_failure()), *lines[-30:]])  # the workers' own error too
    (rec,) = report.recoveries
    assert rec["resumed_step"] in (4, 8) and rec["last_step"] >= 5
    assert 0 < rec["steps_lost"] <= 4
    log = report.to_dict()["log"]
    assert log["summary"]["start_step"] == rec["resumed_step"]
    assert "step=11 " in "\n".join(lines)

    return log["summary"]["param_digest"]


def test_a_recovery_that_could_not_resume_is_said_up_front() -> None:
    assert recover.checkpoint_warnings({"checkpoint.dir": "gs://b/run"}) == []
    (none,) = recover.checkpoint_warnings({"steps": "20"})
    assert none.startswith("no --set checkpoint.dir: a recovered run starts again from step 0")
    (local,) = recover.checkpoint_warnings({"checkpoint.dir": "~/ckpt"})
    assert local.startswith("checkpoint.dir ~/ckpt is not gs://")
