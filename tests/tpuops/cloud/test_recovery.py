"""--recover against the emulator: a preempted VM is recreated, the SOP reruns, the report counts the loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.data import DATA
from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud.emulator.sshd import free_port
from tpuops.config import TargetSpec, state_home
from tpuops.errors import PermissionDeniedError
from tpuops.run import launch
from tpuops.run.result import RunResult

ZONE = "us-central1-a"


def _vm(cloud: Cloud, name: str, accelerator: str = "v4-16", *extra: str) -> str:
    made = cloud.cli(
        "vm", "create", name, "--type", accelerator, "--zone", ZONE, "--runtime-version", "base", *extra
    )
    assert made.returncode == 0, made.stderr
    return next(k for k in cloud.emu.model.nodes if k.endswith(f"/{name}"))


def _request(cloud: Cloud, name: str, bare: Path) -> launch.RunRequest:
    spec = TargetSpec(vm=name, zone=ZONE, api_endpoint=cloud.url, identity=str(cloud.identity))
    sets = {"repo_url": str(bare), "steps": "30", "step_seconds": "0.1", "lockfile": "~/l", "timeout": "120"}
    return launch.RunRequest(sop="smoke", sets=sets, target=spec)


class _AfterSteps(threading.Thread):
    """`action` run in the background once `n` step lines were seen (lines as `_worker_line` keeps them: only
    worker 0's start with "step=", and worker 0's are the ones the recovery's step count reads). Not seen
    `within` seconds, or the run over first (`join`, called once the run returned: a job that died before its
    steps ends the wait at once): nothing is done, and the test fails on the run's own failure or its missing
    recovery, not on an action that reaches into the next test's VM."""

    def __init__(self, lines: list[str], n: int, action: Callable[[], None], within: float) -> None:
        super().__init__(daemon=True)
        self.lines, self.n, self.action, self.within = lines, n, action, within
        self.run_over = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.within
        while sum(ln.startswith("step=") for ln in self.lines) < self.n:
            if time.monotonic() > deadline or self.run_over.is_set():
                return
            time.sleep(0.02)
        self.action()

    def join(self, timeout: float | None = None) -> None:
        self.run_over.set()
        super().join(timeout)


def _after_steps(
    lines: list[str], n: int, action: Callable[[], None], within: float = 60
) -> threading.Thread:
    t = _AfterSteps(lines, n, action, within)
    t.start()
    return t


def _worker_line(lines: list[str]) -> Callable[[int, str], None]:
    """An on_line that keeps worker 0's lines as they are and the others' behind a "[wK] " prefix: under load
    one worker's lines can run ahead of another's."""
    return lambda w, s: lines.append(s if w == 0 else f"[w{w}] {s}")


def _preempt_after(cloud: Cloud, node: str, lines: list[str], n: int, within: float = 60) -> threading.Thread:
    return _after_steps(lines, n, lambda: cloud.emu.model.preempt(node), within)


def _recover_smoke(
    cloud: Cloud, vm_name: str, bare: Path, cwd: Path, lines: list[str], events: list[str], **kw: int
) -> RunResult:
    """The smoke SOP under --recover, watched every 0.2 s; lines and tpuops' events collected."""
    report = launch.start(
        _request(cloud, vm_name, bare), watch_s=0.2, ready_timeout=60, on_line=_worker_line(lines),
        on_notice=events.append, cwd=cwd, **kw,
    )  # fmt: skip
    assert isinstance(report, RunResult)
    return report


@pytest.mark.parametrize("queued", [False, True], ids=["plain", "queued"])
def test_preempted_vm_is_recreated_and_the_run_finishes(
    cloud: Cloud, vm_name: str, git_remote: tuple[Path, str], tmp_path: Path, queued: bool
) -> None:
    """A plain VM is deleted and created again; a queued resource's VM is queued again and awaited."""
    # --wait: a queued create returns once queued; the run is refused while the node is still CREATING.
    node = _vm(cloud, vm_name, "v4-16", *(["--queued", "--spot", "--wait"] if queued else []))
    qr = cloud.emu.model.nodes[node].queued_resource
    lines: list[str] = []
    events: list[str] = []
    killer = _preempt_after(cloud, node, lines, 5)
    report = _recover_smoke(cloud, vm_name, git_remote[0], tmp_path, lines, events, max_recoveries=2)
    killer.join()
    assert report.ok, report.first_failure()
    assert len(report.recoveries) == 1
    rec = report.recoveries[0]
    assert rec["last_step"] >= 4  # worker 0's steps 0..4 were seen before the preemption
    assert rec["resumed_step"] == 0  # the smoke job keeps no checkpoint: it starts over
    assert rec["steps_lost"] == rec["last_step"] + 1
    assert any("PREEMPTED" in e for e in events) and any("READY again" in e for e in events)
    assert cloud.emu.model.nodes[node].state == "READY"
    assert bool(qr) == queued and cloud.emu.model.nodes[node].queued_resource == qr
    if queued:
        assert cloud.emu.model.qrs[qr]["state"] == {"state": "ACTIVE"}
    assert "step=29 " in "\n".join(lines)
    assert report.to_dict()["recoveries"] == list(report.recoveries)
    # The run's record of its end (the last attempt's result.json) has its recoveries too.
    saved = json.loads((state_home() / "runs" / report.run_id / "result.json").read_text())
    assert report.run_id.endswith("-r1") and saved["exit_code"] == 0
    assert saved["recoveries"] == json.loads(json.dumps(list(report.recoveries)))


def test_a_vm_whose_workers_all_stop_answering_is_recreated(
    cloud: Cloud, vm_name: str, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    """The API still says READY, but no worker answers on SSH (a host lost without a state change yet)."""
    node = _vm(cloud, vm_name)
    rec = cloud.emu.model.nodes[node]
    lines: list[str] = []
    events: list[str] = []

    def cut() -> None:
        for w in rec.workers:
            w.stop()  # sshd gone on every worker; the node record stays READY

    cutter = _after_steps(lines, 5, cut)
    (tmp_path / "tpuops.toml").write_text("unreachable_s = 1.5\n")  # the window, from the config file
    report = _recover_smoke(cloud, vm_name, git_remote[0], tmp_path, lines, events, max_recoveries=1)
    cutter.join()
    assert report.ok, report.first_failure()
    (got,) = report.recoveries
    assert got["why"].startswith("was unreachable (no worker answered on SSH for 1.5s; API state READY)")
    assert got["last_step"] >= 4 and got["resumed_step"] == 0
    assert any("was unreachable" in e for e in events) and any("READY again" in e for e in events)
    assert "step=29 " in "\n".join(lines)


def test_recoveries_run_out_with_a_clear_error(
    cloud: Cloud, vm_name: str, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    """Preempted, recreated, preempted again with no recovery left: one clear error (exit 8)."""
    node = _vm(cloud, vm_name)
    lines: list[str] = []

    def preempt_twice() -> None:
        deadline = time.monotonic() + 90
        for _ in range(2):
            seen = sum(ln.startswith("step=") for ln in lines)
            while sum(ln.startswith("step=") for ln in lines) < seen + 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            cloud.emu.model.preempt(node)

    killer = threading.Thread(target=preempt_twice, daemon=True)
    killer.start()
    result = launch.start(
        _request(cloud, vm_name, git_remote[0]),
        max_recoveries=1,
        watch_s=0.2,
        ready_timeout=60,
        on_line=_worker_line(lines),
        cwd=tmp_path,
    )
    killer.join()
    assert result.code == 8 and result.vm_lost is not None
    assert result.vm_lost.endswith("lost 2 times (last: was PREEMPTED); gave up after 1 recoveries")
    assert result.hint == "try another zone, or a reserved (non-spot) VM"
    (rec,) = result.recoveries  # the one recovery made, and the second attempt's steps until its VM went
    assert rec["run_id"] == result.run_id and result.steps
    saved = json.loads((state_home() / "runs" / result.run_id / "result.json").read_text())
    assert (saved["exit_code"], saved["error_class"], len(saved["recoveries"])) == (8, "preempted", 1)


def test_a_vm_run_without_recover_ends_at_once_with_exit_8_when_preempted(
    cloud: Cloud, vm_name: str, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    """No --recover: the run is still watched, and a preempted VM (`tpuops emulator fault preempt`) ends it (no
    follow waiting for dead workers): exit 8, and its --json is the run's report (the steps it ran, no
    recovery) with the error's words, also in its result.json."""
    _vm(cloud, vm_name)
    sets = {"repo_url": str(git_remote[0]), "steps": "600", "step_seconds": "0.1", "lockfile": "~/l"}
    argv = [sys.executable, "-m", "tpuops", "sop", "run", "smoke", "--vm", vm_name, "--zone", ZONE,
            "--identity", str(cloud.identity), "--unreachable-s", "5", "--json"]  # fmt: skip
    argv += [w for k, v in sets.items() for w in ("--set", f"{k}={v}")]
    env = {**os.environ, "TPUOPS_TPU_API": cloud.url, "COLUMNS": "200"}
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    while "[w0] step=3 " not in (line := proc.stderr.readline()):
        assert line, "the run ended before step 3"
    t0 = time.monotonic()
    faulted = cloud.cli("emulator", "fault", "preempt", f"{ZONE}/{vm_name}")
    assert faulted.returncode == 0, faulted.stderr
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 8, err[-2000:]
    assert time.monotonic() - t0 < 30  # the API is watched every 10 s; not the follow's 600 s timeout
    error = json.loads(out)
    assert (error["error"], error["error_class"], error["exit_code"]) == ("preempted", "preempted", 8)
    assert error["message"].startswith(f"{vm_name} was PREEMPTED at step ")
    assert "rerun with --recover" in error["message"] and error["hint"].startswith("rerun with --recover")
    assert error["recoveries"] == [] and not error["ok"]
    ran = [s["title"] for s in error["steps"]]
    assert "start job" in ran and "follow" in ran, ran  # the steps up to the follow the VM's loss ended
    assert err.strip().splitlines()[-1] == f"error: {error['message']}"  # the one line, as any error's
    saved = json.loads((state_home() / "runs" / error["run_id"] / "result.json").read_text())
    assert (saved["exit_code"], saved["message"], saved["recoveries"]) == (8, error["message"], [])


@pytest.mark.slow
def test_bench_rollout_on_a_preempted_vm_ends_with_exit_8(
    cloud: Cloud, vm_name: str, committed_repo: Path, worker_python: str, tmp_path: Path
) -> None:
    """bench runs each variant through launch.start, so its VM is watched like any SOP's: preempted while the
    first variant's trainer runs, the bench ends with exit 8 at once (not at the follow's 86,400 s timeout)."""
    node = _vm(cloud, vm_name, "v4-8")
    head = subprocess.run(
        ["git", "-C", str(committed_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    sets = {
        "repo_url": str(committed_repo), "branch": head.stdout.strip(), "venv": "none", "python": worker_python,
        "data_dir": str(DATA), "config": "toy", "steps": "100000", "lockfile": "~/libtpu_lockfile",
        "coordinator_port": str(free_port()), "log.output_dir": "~/trainer-out",
    }  # fmt: skip
    argv = [sys.executable, "-m", "tpuops", "bench", "rollout", "--vm", vm_name, "--zone", ZONE,
            "--identity", str(cloud.identity), "--skip-fit",
            "--variant", "", "--variant", "train.learning_rate=2e-5"]  # fmt: skip
    argv += [w for k, v in sets.items() for w in ("--set", f"{k}={v}")]
    env = {**os.environ, "TPUOPS_TPU_API": cloud.url, "COLUMNS": "200"}
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + 240
    while " start trainer (" not in (line := proc.stderr.readline()):  # the step line once the job started
        seen.append(line)
        assert line and time.monotonic() < deadline, "the trainer never started:\n" + "".join(seen[-40:])
    cloud.emu.model.preempt(node)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 8, err[-3000:]
    assert time.monotonic() - t0 < 60  # the API is watched every 10 s; not the follow's timeout
    assert f"{vm_name} was PREEMPTED" in err and "rerun with --recover" in err


@pytest.mark.slow
@pytest.mark.parametrize("accelerator", ["tpu7x-8", "tpu7x-16"], ids=["instance", "mig"])
def test_a_compute_engine_vm_preempted_mid_run_is_made_whole_and_the_run_finishes(
    cloud: Cloud, vm_name: str, git_remote: tuple[Path, str], tmp_path: Path, accelerator: str
) -> None:
    """A Spot instance preempted (TERMINATED) is deleted and created again; in a MIG slice one preempted
    instance is recreated by the MIG itself (new address, new host key), and the run resolves it again."""
    from tpuops.cloud import vm_state

    made = cloud.cli("vm", "create", vm_name, "--type", accelerator, "--zone", ZONE, "--spot", "--wait")
    assert made.returncode == 0, made.stderr
    kind = "instance" if accelerator == "tpu7x-8" else "mig"
    before = vm_state.get_vm(cloud.api(), ZONE, vm_name, kind)
    lines: list[str] = []
    events: list[str] = []
    worker = {} if kind == "instance" else {"worker": 1}
    killer = _after_steps(lines, 5, lambda: cloud.emu.admin("preempt", node=vm_name, **worker))
    report = _recover_smoke(cloud, vm_name, git_remote[0], tmp_path, lines, events, max_recoveries=2)
    killer.join()  # at once when the job died before its sixth step
    assert report.ok, "\n".join([str(report.first_failure()), *lines[-30:]])  # the workers' own error too
    (rec,) = report.recoveries
    assert rec["why"].startswith(("was PREEMPTED", "was REPAIRING", "had instances recreated")), rec
    assert rec["last_step"] >= 4 and rec["resumed_step"] == 0
    assert "step=29 " in "\n".join(lines)
    after = vm_state.get_vm(cloud.api(), ZONE, vm_name, kind)
    assert after.state == "READY" and after.spot
    if kind == "instance":
        assert after.instance_ids != before.instance_ids  # deleted and inserted again
    else:
        assert after.instances == before.instances and after.instance_ids[0] == before.instance_ids[0]
        assert after.instance_ids[1] != before.instance_ids[1]  # only the preempted worker was recreated


def test_a_403_during_the_watch_ends_the_run_with_exit_6_naming_the_role(
    cloud: Cloud, vm_name: str, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    """Losing the permission mid-run is an error, not a VM to keep polling: the watch stops the run at once."""
    _vm(cloud, vm_name)
    lines: list[str] = []
    model = cloud.emu.model

    def deny() -> None:
        with model.lock:  # every TPU API call from now on answers 403 PERMISSION_DENIED
            model.faults.unavailable, model.faults.unavailable_code = 10**6, 403

    denier = _after_steps(lines, 3, deny)
    req = _request(cloud, vm_name, git_remote[0])
    req = replace(req, sets={**req.sets, "steps": "3000", "timeout": "600"})
    t0 = time.monotonic()
    with pytest.raises(PermissionDeniedError) as e:
        launch.start(req, watch_s=0.2, on_line=_worker_line(lines), cwd=tmp_path)
    denier.join()
    assert e.value.exit_code == 6 and "permission denied" in e.value.message
    assert e.value.message.startswith(f"watching {vm_name}: ") and "roles/tpu.viewer" in (e.value.hint or "")
    assert time.monotonic() - t0 < 120  # not the follow's 600 s timeout


def test_a_run_that_fails_because_its_vm_went_is_exit_8_before_the_watch_polls(
    cloud: Cloud, vm_name: str, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    """The VM goes between two steps: the next step cannot connect (exit 3 on its own) before the watch's next
    poll. The run asks the API once more before it reports, and says what happened (preempted, exit 8), not the
    symptom. The watch here polls once an hour, so only that last question can tell."""
    node = _vm(cloud, vm_name)
    done: list[str] = []

    def preempt_after_the_first_step(step: object) -> None:
        done.append(str(getattr(step, "name", step)))
        if len(done) == 1:
            cloud.emu.model.preempt(node)

    req = _request(cloud, vm_name, git_remote[0])
    t0 = time.monotonic()
    result = launch.start(
        req, max_recoveries=0, watch_s=3600, on_step=preempt_after_the_first_step, cwd=tmp_path
    )
    assert result.code == 8 and f"{vm_name} was PREEMPTED" in (result.vm_lost or ""), result.vm_lost
    assert result.recoveries == () and "rerun with --recover" in (result.hint or "")
    assert len(done) >= 1 and time.monotonic() - t0 < 120, done
