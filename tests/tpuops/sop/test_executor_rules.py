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
        .expect("tpuops-run.lock", stdout="tpuops: claimed pid=1\n")  # the run lock, taken and given back
        .expect("git clone", worker=0, stdout="tpuops: sha=aaaaaaa changed=1\n")
        .expect("git clone", worker=1, stdout="tpuops: sha=bbbbbbb changed=1\n")
    )
    steps = sop({"kind": "git_sync", "repo": "file:///r"}, {"kind": "run", "command": "train"})
    report = Executor(t).execute(steps, {}, "r", [0, 1])
    check = report.steps[-1]
    assert check.kind == "preflight" and "sha bbbbbbb (w0 has aaaaaaa)" in check.outcomes[1].detail
    assert t.ran("setsid nohup sh -c") == []  # nothing was started
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


# -- a run's life: the lock and the checks before anything changes, all or none ----------------------------
CLAIM = 'mkdir "\\$lock" 2>&1'  # the claim script (the release script has no mkdir)
RELEASE = "give the run lock back"  # the release script's first line
STOP = "stop what this run started here"  # the all-or-none stop's


def test_a_refused_claim_on_worker_0_stops_the_start_before_any_step_or_other_worker() -> None:
    busy = "tpuops: active run=other pid=42\n"
    t = MemoryTransport(2).expect(CLAIM, worker=0, exit_code=75, stdout=busy)
    report = Executor(t).execute(sop({"kind": "git_sync", "repo": "file:///r"}), {}, "r", [0, 1])
    assert statuses(report) == [{0: "busy", 1: "skipped"}]
    assert (
        report.steps[0].outcomes[0].detail
        == "run other (pid 42) is active on this worker (use --force to stop it)"
    )
    assert [w for w, _ in t.calls] == [0]  # worker 1 was never asked anything
    assert exit_code(report) == ExitCode.TPU_BUSY


def test_a_failed_check_gives_every_lock_back_and_changes_nothing() -> None:
    t = (
        MemoryTransport(2)
        .expect(CLAIM, stdout="tpuops: claimed pid=1\n")
        .expect(
            "exit 0  # a check only", worker=1, exit_code=75, stdout="tpuops: holder pid=7 why=device cmd=x\n"
        )
        .expect("exit 0  # a check only", worker=0)
        .expect(RELEASE, stdout="tpuops: released\n")
    )
    steps = sop({"kind": "clear_lockfile", "lockfile": "~/l"}, {"kind": "run", "command": "train"})
    report = Executor(t).execute(steps, {}, "r", [0, 1])
    assert [s.title for s in report.steps] == ["checks"]
    assert statuses(report) == [{0: "ok", 1: "busy"}]
    assert sorted(w for w, _ in t.ran(RELEASE)) == [0, 1]
    assert t.ran('rm -f "$lock" && echo') == [] and t.ran("setsid nohup sh -c") == []
    assert exit_code(report) == ExitCode.TPU_BUSY


def test_a_start_that_fails_on_one_worker_stops_the_others_and_says_so() -> None:
    t = (
        MemoryTransport(2)
        .expect(CLAIM, stdout="tpuops: claimed pid=1\n")
        .expect(
            "setsid nohup sh -c",
            worker=0,
            exit_code=1,
            stderr="mkdir: cannot create directory: Permission denied\n",
        )
        .expect("setsid nohup sh -c", worker=1, stdout="tpuops: started pid=4242\n")
        .expect(STOP, worker=1, stdout="tpuops: stopped pid=4242\n")
        .expect(RELEASE)
    )
    report = Executor(t).execute(
        sop({"kind": "run", "command": "train", "runs_dir": "~/runs"}), {}, "r", [0, 1]
    )
    (run,) = report.steps
    assert run.outcomes[0].status == "failed" and "Permission denied" in run.outcomes[0].detail
    assert (run.outcomes[1].status, run.outcomes[1].detail) == (
        "cancelled",
        "started pid 4242, then stopped: the start failed on w0",
    )
    assert [w for w, _ in t.ran(STOP)] == [1]  # w0's start stopped itself: exit 1, nothing started
    assert sorted(w for w, _ in t.ran(RELEASE)) == [0, 1]  # w1's lock went with its job; w0's is given back
    assert report.first_failure()[1] == 0 and exit_code(report) == ExitCode.FAILED


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        (Kind.CONNECT, "connection lost"),
        (Kind.EXIT, "the command was killed on the worker"),
        (Kind.TIMEOUT, "timed out"),
    ],
)
def test_a_start_that_ends_without_its_answer_is_stopped_there_too(kind: Kind, error: str) -> None:
    """Worker 0's start ended without saying whether it started the job (its connection dropped, its shell was
    killed, it timed out): the job it may have started is looked for and stopped like worker 1's, and the report
    says which it was. Never left running with its lock given back."""
    t = (
        MemoryTransport(2)
        .expect(CLAIM, stdout="tpuops: claimed pid=1\n")
        .expect("setsid nohup sh -c", worker=0, exit_code=255, kind=kind, error=error)
        .expect("setsid nohup sh -c", worker=1, stdout="tpuops: started pid=4242\n")
        .expect(STOP, worker=0, stdout="tpuops: stopped pid=4141\ntpuops: released\n")
        .expect(STOP, worker=1, stdout="tpuops: stopped pid=4242\ntpuops: released\n")
        .expect(RELEASE)
        .expect(
            "lock-lost", worker=0
        )  # a step killed on its worker: did `tpuops stop` end it? (no: still ours)
    )
    report = Executor(t).execute(
        sop({"kind": "run", "command": "train", "runs_dir": "~/runs"}), {}, "r", [0, 1]
    )
    (run,) = report.steps
    assert run.outcomes[0].status == ("timeout" if kind is Kind.TIMEOUT else "failed")
    assert run.outcomes[0].detail.startswith(error)
    assert run.outcomes[0].detail.endswith("; its job had started (pid 4141) and was stopped")
    assert run.outcomes[1].status == "cancelled"
    assert sorted(w for w, _ in t.ran(STOP)) == [0, 1]
    assert exit_code(report) == (ExitCode.TIMEOUT if kind is Kind.TIMEOUT else ExitCode.FAILED)


def test_a_start_without_its_answer_where_nothing_started_says_so() -> None:
    t = (
        MemoryTransport(1)
        .expect(CLAIM, stdout="tpuops: claimed pid=1\n")
        .expect("setsid nohup sh -c", exit_code=255, kind=Kind.CONNECT, error="connection lost")
        .expect(STOP, stdout="tpuops: released\n")
        .expect(RELEASE)
    )
    report = Executor(t).execute(sop({"kind": "run", "command": "train"}), {}, "r", [0])
    (run,) = report.steps
    assert run.outcomes[0].detail == "connection lost; no job of it runs there"


def test_a_start_without_its_answer_on_a_worker_that_stays_unreachable_names_tpuops_stop() -> None:
    t = (
        MemoryTransport(1)
        .expect(CLAIM, stdout="tpuops: claimed pid=1\n")
        .expect("setsid nohup sh -c", exit_code=255, kind=Kind.CONNECT, error="connection lost")
        .expect(STOP, exit_code=255, kind=Kind.CONNECT, error="connection lost")
        .expect(RELEASE, exit_code=255, kind=Kind.CONNECT, error="connection lost")
    )
    report = Executor(t).execute(sop({"kind": "run", "command": "train"}), {}, "r9", [0])
    (run,) = report.steps
    assert (
        run.outcomes[0].detail == "connection lost; whether its job started there is unknown: tpuops stop r9"
    )
