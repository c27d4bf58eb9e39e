"""One run per VM, identical workers before a run starts, and hung workers detected while following."""

from __future__ import annotations

import time
from pathlib import Path

from tests.tpuops.conftest import SshdPool, commit_to
from tpuops.errors import ExitCode
from tpuops.run.result import exit_code
from tpuops.shell import ALIVE
from tpuops.sop.actions import Command
from tpuops.sop.executor import Executor, StepReport, consistency
from tpuops.sop.loader import Sop
from tpuops.sop.model import PlanContext
from tpuops.sop.runs import Run
from tpuops.sop.steps import GitSync


def job_sop(command: str, **follow: object) -> Sop:
    return Sop.model_validate(
        {
            "name": "job",
            "steps": [
                {"kind": "run", "command": command, "runs_dir": "~/runs"},
                {"kind": "follow", "runs_dir": "~/runs", "poll_s": 0.05, "stream": "first", **follow},
            ],
        }
    )


def test_second_run_is_refused_naming_the_holder_then_force_stops_it(sshd_pool: SshdPool) -> None:
    (w,) = sshd_pool.take(1)
    long = Sop.model_validate(
        {"name": "long", "steps": [{"kind": "run", "command": "sleep 600", "runs_dir": "~/runs"}]}
    )
    t = sshd_pool.transport([w])
    first = Executor(t).execute(long, {}, "run-one", [0])
    assert first.ok
    pid = first.steps[0].outcomes[0].data["pid"]
    second = Executor(t).execute(long, {}, "run-two", [0])
    outcome = second.steps[0].outcomes[0]
    assert outcome.status == "busy"
    assert f"run run-one (pid {pid})" in outcome.detail
    assert exit_code(second) == ExitCode.TPU_BUSY
    forced = Executor(t, force=True).execute(long, {}, "run-two", [0])
    assert forced.ok
    assert (w.home / "runs/run-one/worker-0.exit").read_text().split() == ["143", "stopped"]
    assert (
        t.run(0, f"{ALIVE}; alive {pid} || echo gone").stdout == "gone\n"
    )  # the holder is gone (or a zombie)
    t.run(0, "kill -KILL -- -$(cat ~/runs/run-two/worker-0.pid)")
    t.close()


def test_consistency_names_the_worker_on_another_commit(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    workers = sshd_pool.take(2)
    bare, first = git_remote
    second = commit_to(bare, tmp_path, "c.py", "c = 3\n")
    sync = Sop.model_validate(
        {
            "name": "s",
            "params": {"ref": {"type": "str"}},
            "steps": [{"kind": "git_sync", "repo": str(bare), "ref": "{ref}", "dir": "~/repo"}],
        }
    )
    t = sshd_pool.transport(workers)
    old = Executor(t).execute(sync, {"ref": first}, "s0", [0]).steps[0]
    new = Executor(t).execute(sync, {"ref": second}, "s1", [1]).steps[0]
    t.close()
    merged = StepReport("git_sync", "git_sync", outcomes={**old.outcomes, **new.outcomes})
    check = consistency([merged], [0, 1])
    assert check is not None and check.outcomes[0].status == "ok"
    assert check.outcomes[1].status == "failed"
    assert check.outcomes[1].detail == f"sha {second[:7]} (w0 has {first[:7]})"
    same = StepReport("git_sync", "git_sync", outcomes={0: old.outcomes[0], 1: old.outcomes[0]})
    assert consistency([same], [0, 1]) is None


class DriftingSync(GitSync):
    """Reports a different commit per worker, as a half-synced VM would (the gate reads the real parser)."""

    def plan(self, ctx: PlanContext) -> list:
        return [Command(f"echo 'tpuops: sha=abc000{ctx.worker} changed=0'")]


def test_executor_refuses_to_start_a_run_on_inconsistent_workers(sshd_pool: SshdPool) -> None:
    workers = sshd_pool.take(2)
    sop = Sop.model_construct(
        name="drift",
        params={},
        preflight=[],
        scan=None,
        overrides=None,
        steps=[DriftingSync(repo="x"), Run(command="touch ~/started", runs_dir="~/runs")],
    )
    report = Executor(sshd_pool.transport(workers)).execute(sop, {}, "drift", [0, 1])
    assert [s.title for s in report.steps] == ["git_sync", "preflight consistency"]
    assert report.first_failure()[1] == 1
    assert not any((w.home / "started").exists() for w in workers)


def test_hung_worker_is_detected_within_the_window(sshd_pool: SshdPool) -> None:
    (w,) = sshd_pool.take(1)
    # Steps every 0.1 s, then silence forever after step 5.
    cmd = "i=0; while [ $i -lt 6 ]; do echo step=$i dt=0.10s; i=$((i+1)); sleep 0.1; done; sleep 600"
    sop = job_sop(cmd, hang_factor=10, hang_min_s=1.0, timeout=60)
    t = sshd_pool.transport([w])
    t0 = time.monotonic()
    report = Executor(t).execute(sop, {}, "hang-run", [0])
    took = time.monotonic() - t0
    outcome = report.steps[1].outcomes[0]
    assert outcome.status == "hang"
    assert "no step line for" in outcome.detail
    assert exit_code(report) == ExitCode.HANG
    assert took < 10  # detected after ~1 s of silence, not at the 60 s timeout
    t.run(0, "kill -KILL -- -$(cat ~/runs/hang-run/worker-0.pid)")
    t.close()


def test_steady_run_is_not_called_hung(sshd_pool: SshdPool) -> None:
    (w,) = sshd_pool.take(1)
    cmd = "i=0; while [ $i -lt 12 ]; do echo step=$i dt=0.10s; i=$((i+1)); sleep 0.1; done"
    report = Executor(sshd_pool.transport([w])).execute(
        job_sop(cmd, hang_factor=10, hang_min_s=1.0), {}, "ok-run", [0]
    )
    assert report.ok, report.first_failure()


HANGING_TRAINER = """
import time
for i in range(4):
    print(f"step={i} dt=0.10s", flush=True)
    time.sleep(0.1)
def wait_for_a_collective_that_never_comes():
    time.sleep(600)
wait_for_a_collective_that_never_comes()
"""


def test_hung_python_job_is_dumped_with_py_spy(sshd_pool: SshdPool, worker_python: str) -> None:
    (w,) = sshd_pool.take(1)
    (w.home / "hang.py").write_text(HANGING_TRAINER)
    sop = job_sop(f"{worker_python} ~/hang.py", hang_factor=10, hang_min_s=1.0, timeout=60, py_spy=True)
    t = sshd_pool.transport([w])
    report = Executor(t).execute(sop, {}, "hang-spy", [0])
    outcome = report.steps[1].outcomes[0]
    assert outcome.status == "hang", outcome
    dump = str(outcome.data.get("py_spy", ""))
    # The Python stack of the job, innermost frame first: where it hangs and who called it.
    assert "py-spy dump --pid " in dump and "Thread " in dump, dump
    frames = [ln.strip() for ln in dump.splitlines() if "hang.py:" in ln]
    assert frames[0].startswith("wait_for_a_collective_that_never_comes (") and "<module>" in frames[1], dump
    t.run(0, "kill -KILL -- -$(cat ~/runs/hang-spy/worker-0.pid)")
    t.close()


def test_stall_after_three_steps_on_a_real_worker_is_exit_9_before_the_timeout(sshd_pool: SshdPool) -> None:
    (w,) = sshd_pool.take(1)
    cmd = "for i in 0 1 2; do echo step=$i dt=0.30s; sleep 0.3; done; sleep 600"
    t = sshd_pool.transport([w])
    t0 = time.monotonic()
    report = Executor(t).execute(job_sop(cmd, hang_factor=3, hang_min_s=1.0, timeout=60), {}, "hang3", [0])
    took = time.monotonic() - t0
    assert report.steps[1].outcomes[0].status == "hang", report.steps[1].outcomes[0]
    assert exit_code(report) == ExitCode.HANG and took < 10
    t.run(0, "kill -KILL -- -$(cat ~/runs/hang3/worker-0.pid)")
    t.close()
