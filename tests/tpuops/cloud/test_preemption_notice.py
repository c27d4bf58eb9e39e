"""A Spot VM's preemption notice on the emulator: the workers' metadata says `preempted` 20 s before the VM goes, the
bundled trainer checkpoints at the step boundary and exits, `--recover` recreates the VM and resumes from there."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.data import DATA, PACED_TOKENIZER
from tests.tpuops.cloud.conftest import Cloud
from tests.tpuops.cloud.test_recovery import ZONE, _vm, _worker_line
from tpuops.cloud.emulator.sshd import free_port
from tpuops.config import TargetSpec
from tpuops.console import err
from tpuops.run import launch, report


def _notice_at_step(cloud: Cloud, node: str, home: Path, step: int, within: float = 300) -> None:
    """The 20 s notice the moment worker 0's log says step `step` runs (its previous step's line is written): read
    on the worker's own disk every 10 ms, since the follow's 0.5 s poll is longer than a toy step. Not seen in time
    (the run failed first): nothing is done, and the test fails on the run's own failure."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for log in (home / "tpuops" / "runs").glob("*/worker-0.log"):
            if f"step={step - 1} " in log.read_text(errors="replace"):
                cloud.emu.admin("preempt", node=node, notice=20)
                return
        time.sleep(0.01)


@pytest.mark.slow
def test_a_notice_at_step_12_checkpoints_there_and_the_recovered_run_resumes_with_at_most_a_step_lost(
    cloud: Cloud,
    vm_name: str,
    committed_repo: Path,
    worker_python: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """20 toy steps, a periodic checkpoint every 8 (far from step 12): a 20 s preemption notice while step 12 runs
    (the emulator's `fault preempt --notice 20`); the run resumes at step 12 or 13, and its report says it
    checkpointed on the notice."""
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
    home = cloud.emu.model.nodes[node].workers[0].home
    noticer = threading.Thread(target=_notice_at_step, args=(cloud, node, home, 12), daemon=True)
    noticer.start()
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
        noticer.join(timeout=5)
        subprocess.run(["rm", "-rf", str(ckpt)], check=False)
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


def test_fault_preempt_with_a_notice_announces_it_on_every_workers_metadata_then_preempts(
    cloud: Cloud, vm_name: str, tmp_path: Path
) -> None:
    """The CLI returns at once; each worker's sessions find their metadata server through GCE_METADATA_HOST, which
    says `preempted` TRUE until the VM is PREEMPTED, `--notice` seconds later."""
    node = _vm(cloud, vm_name, "v4-16")
    cmd = "echo GCE_METADATA_HOST=$GCE_METADATA_HOST"
    ran = cloud.cli(
        "run", "exec", "--vm", vm_name, "--identity", str(cloud.identity), "--set", f"cmd={cmd}", "--json"
    )
    assert ran.returncode == 0, ran.stderr
    (step,) = [s for s in json.loads(ran.stdout)["steps"] if s["kind"] == "shell"]
    hosts = [re.search(r"GCE_METADATA_HOST=(\S+)", step["workers"][str(w)]["detail"]) for w in (0, 1)]
    assert all(hosts) and hosts[0] != hosts[1]  # one server per worker
    urls = [f"http://{m.group(1)}/computeMetadata/v1/instance/preempted" for m in hosts if m]

    def preempted(url: str) -> str:
        req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read().decode()

    assert [preempted(u) for u in urls] == ["FALSE", "FALSE"]
    t0 = time.monotonic()
    faulted = cloud.cli("emulator", "fault", "preempt", f"{ZONE}/{vm_name}", "--notice", "3")
    assert faulted.returncode == 0, faulted.stderr
    assert [preempted(u) for u in urls] == ["TRUE", "TRUE"]
    assert cloud.emu.model.nodes[node].state == "READY"  # the notice comes first
    while cloud.emu.model.nodes[node].state != "PREEMPTED":
        assert time.monotonic() - t0 < 30
        time.sleep(0.1)
    assert time.monotonic() - t0 >= 2.9
