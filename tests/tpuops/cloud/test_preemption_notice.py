"""A Spot VM's preemption notice on the emulator: the workers' metadata says `preempted` 20 s before the VM goes, the
bundled trainer checkpoints at the step boundary and exits, `--recover` recreates the VM and resumes from there."""

from __future__ import annotations

import io
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.data import DATA, PACED_TOKENIZER
from tests.tpuops.cloud.conftest import Cloud
from tests.tpuops.cloud.test_recovery import ZONE, _after_steps, _vm, _worker_line
from tpuops.cloud.emulator.sshd import free_port
from tpuops.config import TargetSpec
from tpuops.console import err
from tpuops.run import launch, report


@pytest.mark.slow
def test_a_notice_at_step_12_checkpoints_there_and_the_recovered_run_resumes_with_at_most_a_step_lost(
    cloud: Cloud,
    vm_name: str,
    committed_repo: Path,
    worker_python: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """20 toy steps, a periodic checkpoint every 8 (far from step 12): `tpuops emulator fault preempt --notice 20`
    while step 12 runs; the run resumes at step 12 or 13, and its report says it checkpointed on the notice."""
    node = _vm(cloud, vm_name, "v4-8", "--spot")
    ckpt = Path(tempfile.mkdtemp(prefix="tpuops-ckpt-"))
    ckpt.chmod(0o1777)  # every worker user writes there: a checkpoint that outlives the VM
    head = subprocess.run(
        ["git", "-C", str(committed_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    sets = {
        "repo_url": str(committed_repo), "branch": head.stdout.strip(), "venv": "none", "python": worker_python,
        "data_dir": str(DATA), "config": "toy", "steps": "20", "lockfile": "~/libtpu_lockfile",
        "coordinator_port": str(free_port()), "checkpoint.dir": str(ckpt / "run"), "checkpoint.every": "8",
        "rollout.samples_per_prompt": "4", "train.micro_batch": "8", "model.tokenizer": PACED_TOKENIZER,
        "log.output_dir": "~/trainer-out",
    }  # fmt: skip
    lines: list[str] = []
    events: list[str] = []
    faults: list[subprocess.CompletedProcess[str]] = []

    def notice() -> None:  # as an operator (or Compute Engine) would: from outside, through the CLI
        faults.append(cloud.cli("emulator", "fault", "preempt", f"{ZONE}/{vm_name}", "--notice", "20"))

    noticer = _after_steps(lines, 12, notice, within=300)  # step=0..11 seen: step 12 runs
    try:
        result = launch.start(
            launch.RunRequest(
                sop="grpo", sets=sets,
                target=TargetSpec(vm=vm_name, zone=ZONE, api_endpoint=cloud.url, identity=str(cloud.identity)),
                skip_fit=True,
            ),
            max_recoveries=1, watch_s=0.2, ready_timeout=120, on_line=_worker_line(lines),
            on_notice=events.append, cwd=tmp_path,
        )  # fmt: skip
    finally:
        noticer.join()
        subprocess.run(["rm", "-rf", str(ckpt)], check=False)
    assert faults and faults[0].returncode == 0, faults and faults[0].stderr
    assert result.ok, "\n".join([str(result.first_failure()), *lines[-30:]])
    text = "\n".join(lines)
    assert "stopped: SIGTERM (preemption notice: instance/preempted=TRUE) after step=" in text
    (rec,) = result.recoveries
    assert rec["why"] == "was PREEMPTED" and rec["notice"] is True
    assert rec["resumed_step"] in (12, 13) and rec["notice_checkpoint"] == rec["resumed_step"]
    assert rec["steps_lost"] is not None and rec["steps_lost"] <= 1
    assert result.to_dict()["log"]["summary"]["start_step"] == rec["resumed_step"]
    assert "step=19 " in text
    assert any(f"checkpointed on preemption notice at step {rec['resumed_step']}" in e for e in events)
    assert cloud.emu.model.nodes[node].state == "READY"

    shown = io.StringIO()
    monkeypatch.setattr(err, "file", shown)
    report.sop_report(result, as_json=False)
    assert f"checkpointed on preemption notice at step {rec['resumed_step']}" in shown.getvalue()
