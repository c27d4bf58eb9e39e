"""The executor's rules in milliseconds, over the in-memory transport: fail-fast, keep-going, `always` steps, the
consistency check before a run, and each typed way a command or a follow ends -> step status -> exit code.
(The same rules against real sshd: test_executor_ssh.py, test_reliability.py.)"""

from __future__ import annotations

import pytest

from tpuops.errors import ExitCode
from tpuops.logs.events import LogReport
from tpuops.run.result import exit_code
from tpuops.sop.executor import Executor, SopReport
from tpuops.sop.loader import Sop
from tpuops.transport.base import Kind
from tpuops.transport.memory import MemoryTransport, UnexpectedCommandError


def sop(*steps: dict[str, object]) -> Sop:
    return Sop.model_validate({"name": "rules", "steps": list(steps)})


def shell(command: str, **kw: object) -> dict[str, object]:
    return {"kind": "shell", "command": command, **kw}


def statuses(report: SopReport) -> list[dict[int, str]]:
    return [{w: str(o.status) for w, o in sorted(s.outcomes.items())} for s in report.steps]


def test_a_failure_cancels_the_other_workers_and_skips_the_later_steps() -> None:
    t = MemoryTransport(2).expect("first", worker=0, hold=True).expect("first", worker=1, exit_code=3)
    report = Executor(t).execute(sop(shell("first"), shell("second")), {}, "r", [0, 1])
    assert statuses(report) == [{0: "cancelled", 1: "failed"}]  # w0 was stopped, "second" never asked for
    assert t.ran("second") == []
    assert report.first_failure()[1] == 1  # the cause is w1's failure, not w0's cancellation
    assert exit_code(report) == ExitCode.FAILED


def test_keep_going_runs_the_rest_on_the_workers_that_did_not_fail() -> None:
    t = MemoryTransport(3).expect("first", worker=1, exit_code=1).expect("first").expect("second")
    report = Executor(t, keep_going=True).execute(sop(shell("first"), shell("second")), {}, "r", [0, 1, 2])
    assert statuses(report) == [{0: "ok", 1: "failed", 2: "ok"}, {0: "ok", 2: "ok"}]
    assert sorted(w for w, _ in t.ran("second")) == [0, 2]
    assert exit_code(report) == ExitCode.FAILED


def test_after_a_failure_only_always_steps_run() -> None:
    t = MemoryTransport(1).expect("first", exit_code=2).expect("cleanup")
    steps = sop(shell("first"), shell("skipped"), shell("cleanup", always=True))
    report = Executor(t).execute(steps, {}, "r", [0])
    assert [s.title for s in report.steps] == ["shell", "shell"] and t.ran("skipped") == []
    assert statuses(report) == [{0: "failed"}, {0: "ok"}]


def test_workers_at_different_commits_are_refused_before_the_run_step() -> None:
    t = (
        MemoryTransport(2)
        .expect("git clone", worker=0, stdout="tpuops: sha=aaaaaaa changed=1\n")
        .expect("git clone", worker=1, stdout="tpuops: sha=bbbbbbb changed=1\n")
    )
    steps = sop({"kind": "git_sync", "repo": "file:///r"}, {"kind": "run", "command": "train"})
    report = Executor(t).execute(steps, {}, "r", [0, 1])
    check = report.steps[-1]
    assert check.kind == "preflight" and "sha bbbbbbb (w0 has aaaaaaa)" in check.outcomes[1].detail
    assert t.ran("setsid nohup") == []  # nothing was started
    assert exit_code(report) == ExitCode.INCONSISTENT


@pytest.mark.parametrize(
    ("kind", "code", "status", "exit"),
    [
        (Kind.TIMEOUT, 124, "timeout", ExitCode.TIMEOUT),
        (Kind.CONNECT, 255, "failed", ExitCode.FAILED),
        (Kind.EXIT, 124, "failed", ExitCode.FAILED),  # a command that itself exits 124 did not time out
        (Kind.OK, 0, "ok", ExitCode.OK),
    ],
)
def test_a_command_s_kind_decides_its_status_not_its_words(
    kind: Kind, code: int, status: str, exit: ExitCode
) -> None:
    t = MemoryTransport(1).expect("job", exit_code=code, kind=kind, error="timed out (words are not read)")
    report = Executor(t).execute(sop(shell("job")), {}, "r", [0])
    assert statuses(report) == [{0: status}] and exit_code(report) == exit


FOLLOW = {"kind": "follow", "runs_dir": "~/runs", "poll_s": 0.0, "timeout": 5}


def _follow_report(t: MemoryTransport) -> SopReport:
    return Executor(t).execute(sop(FOLLOW), {}, "r1", [0])


def test_a_follow_ends_at_the_job_s_exit_file_with_its_code_typed() -> None:
    t = MemoryTransport(1)
    t.files[0] = {"~/runs/r1/worker-0.log": b"step=0 dt=1.0s\n", "~/runs/r1/worker-0.exit": b"3\n"}
    outcome = _follow_report(t).steps[0].outcomes[0]
    assert (outcome.status, outcome.data["exit_code"], outcome.detail) == ("failed", 3, "job exited 3")
    t.files[0]["~/runs/r1/worker-0.exit"] = b"0\n"
    assert statuses(_follow_report(t)) == [{0: "ok"}]


def test_exit_code_takes_the_log_s_cause_and_recompiles_only_when_asked() -> None:
    t = MemoryTransport(1).expect("job")
    ok = Executor(t).execute(sop(shell("job")), {}, "r", [0])
    recompiled = LogReport(source="x", steps=5, compiles={"total": 3, "after_warmup": 1})
    assert exit_code(ok, recompiled) == ExitCode.OK
    assert exit_code(ok, recompiled, fail_on_recompile=True) == ExitCode.RECOMPILE
    assert exit_code(ok, LogReport(source="x"), fail_on_recompile=True) == ExitCode.UNVERIFIED  # saw nothing


def test_an_unforeseen_command_fails_the_test() -> None:
    t = MemoryTransport(1).expect("^echo hi$")
    with pytest.raises(UnexpectedCommandError, match="rm -rf"):
        t.run(0, "rm -rf /")
    report = Executor(t).execute(sop(shell("rm -rf /")), {}, "r", [0])  # the executor reports it as a failure
    assert (
        statuses(report) == [{0: "failed"}] and "UnexpectedCommandError" in report.steps[0].outcomes[0].detail
    )
