"""--recover against the emulator: a preempted VM is recreated, the SOP reruns, the report counts the loss."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tpuops import recovery, runner
from tpuops.errors import PreemptedError
from tpuops.targets import TargetSpec

ZONE = "us-central1-a"


def _vm(cloud: Cloud, name: str) -> str:
    assert (
        cloud.cli(
            "vm", "create", name, "--type", "v4-16", "--zone", ZONE, "--runtime-version", "base"
        ).returncode
        == 0
    )
    return next(k for k in cloud.emu.model.nodes if k.endswith(f"/{name}"))


def _request(cloud: Cloud, name: str, bare: Path) -> runner.RunRequest:
    spec = TargetSpec(vm=name, zone=ZONE, api_endpoint=cloud.url, identity=str(cloud.identity))
    sets = {"repo_url": str(bare), "steps": "30", "step_seconds": "0.1", "lockfile": "~/l", "timeout": "120"}
    return runner.RunRequest(sop="smoke", sets=sets, target=spec)


def _preempt_after(cloud: Cloud, node: str, lines: list[str], n: int) -> threading.Thread:
    def go() -> None:
        deadline = time.monotonic() + 60
        while sum(ln.startswith("step=") for ln in lines) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        cloud.emu.model.preempt(node)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_preempted_vm_is_recreated_and_the_run_finishes(
    cloud: Cloud, vm_name: str, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    node = _vm(cloud, vm_name)
    lines: list[str] = []
    events: list[str] = []
    killer = _preempt_after(cloud, node, lines, 5)
    report = recovery.run_with_recovery(
        _request(cloud, vm_name, git_remote[0]),
        max_recoveries=2,
        watch_s=0.2,
        ready_timeout=60,
        on_line=lambda w, s: lines.append(s),
        on_event=events.append,
        cwd=tmp_path,
    )
    killer.join()
    assert report.ok, report.first_failure()
    assert len(report.recoveries) == 1
    rec = report.recoveries[0]
    assert rec["last_step"] >= 4
    assert rec["resumed_step"] == 0  # the smoke job keeps no checkpoint: it starts over
    assert rec["steps_lost"] == rec["last_step"] + 1
    assert any("PREEMPTED" in e for e in events) and any("READY again" in e for e in events)
    assert cloud.emu.model.nodes[node].state == "READY"
    assert "step=29 " in "\n".join(lines)
    assert report.to_dict(0)["recoveries"] == report.recoveries


def test_recoveries_run_out_with_a_clear_error(
    cloud: Cloud, vm_name: str, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    node = _vm(cloud, vm_name)
    lines: list[str] = []
    killer = _preempt_after(cloud, node, lines, 2)
    with pytest.raises(PreemptedError, match=r"preempted 1 times; gave up after 0 recoveries"):
        recovery.run_with_recovery(
            _request(cloud, vm_name, git_remote[0]),
            max_recoveries=0,
            watch_s=0.2,
            on_line=lambda w, s: lines.append(s),
            cwd=tmp_path,
        )
    killer.join()
