"""finish.judge on recorded logs and step reports, for the classes test_one_verdict.py does not read (its own:
an out-of-memory, a held TPU, a recompile, a hang, a lost worker): a lost VM, a stop, a check that saw nothing,
a regression, a job's own failure, the steps' own failures; a bench's verdict of its variants; a run's record."""

from __future__ import annotations

import json
from pathlib import Path

from tpuops.errors import ExitCode
from tpuops.logs.events import LogReport, merge
from tpuops.logs.scanner import LogScanner
from tpuops.run import finish
from tpuops.run.baseline import compare
from tpuops.run.result import RunResult
from tpuops.sop.executor import SopReport, StepReport
from tpuops.sop.model import Outcome

STEPS = ["step=0 loss=0.5 dt=1.00s", "step=1 loss=0.4 dt=1.00s", "step=2 loss=0.3 dt=1.00s"]
TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "train.py", line 3, in <module>',
    "ValueError: my bug",
]
OOM = "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB."


def _log(*lines: str, exit_code: int | None = 0, worker: int = 0) -> LogReport:
    s = LogScanner(warmup=1, worker=worker)
    for ln in lines:
        s.feed(ln)
    s.exit(exit_code)
    return s.close()


def _steps(*outcomes: tuple[str, str, Outcome, str | None]) -> SopReport:
    """A SOP's report on worker 0: (title, kind, outcome, error kind) per step."""
    report = SopReport("job", "r1", "ssh", [0])
    for title, kind, outcome, error in outcomes:
        step = StepReport(title, kind, {0: outcome})
        if error:
            step.error_kind[0] = error
        report.steps.append(step)
    return report


def test_a_lost_vm_is_exit_8_with_its_hint_whatever_its_steps_or_log_say() -> None:
    loss = finish.VmLoss("v was PREEMPTED at step 2; the run is lost with it", "rerun with --recover")
    failed = _steps(("follow", "follow", Outcome("failed", "worker gone"), "connect"))
    for log in (_log(*STEPS, exit_code=None), _log(*STEPS, OOM, exit_code=1), None):
        verdict = finish.judge(log, steps=failed, vm_lost=loss)
        assert (verdict.code, verdict.hint, verdict.vm_lost) == (ExitCode.PREEMPTED, loss.hint, loss.what)
        assert verdict.error_line() == f"{loss.what} (rerun with --recover)"
    assert finish.judge(_log(*STEPS), steps=_steps()).error_line() is None  # no VM lost: no error line


def test_a_stopped_run_is_stopped_unless_a_worker_failed_on_its_own() -> None:
    stopped = _log(*STEPS, exit_code=143)
    verdict = finish.judge(stopped, stopped=[0])
    assert (verdict.code, verdict.stopped, verdict.words) == (ExitCode.STOPPED, (0,), "stopped")
    both = merge([stopped, _log(*TRACEBACK, exit_code=1, worker=1)])  # w1 failed before the stop reached it
    assert finish.judge(both, stopped=[0]).code == ExitCode.FAILED
    step_said = _steps(("follow", "follow", Outcome("failed", "stopped", {"stopped": True}), None))
    assert finish.judge(None, steps=step_said).code == ExitCode.STOPPED


def test_a_recompile_check_that_saw_nothing_is_unverified_read_any_way() -> None:
    no_steps = _log("Compiling f with global shapes", "hello")
    no_compiles = _log(*STEPS)
    for log, why in ((no_steps, "no step line seen"), (no_compiles, "JAX compile logging not seen")):
        for steps in (None, _steps(("run", "run", Outcome("ok"), None))):
            verdict = finish.judge(log, steps=steps, fail_on_recompile=True)
            assert verdict.code == ExitCode.UNVERIFIED and (verdict.hint or "").startswith(why), verdict
    assert finish.judge(no_compiles).code == ExitCode.OK  # a run that checks no recompile is judged as ok


def test_a_job_s_own_failure_and_a_regression_are_exit_1() -> None:
    crashed = _log(*STEPS[:1], *TRACEBACK, exit_code=1)
    assert finish.judge(crashed).code == ExitCode.FAILED
    assert finish.judge(crashed).hint is None
    baseline = {"report": _log(*STEPS).to_dict()}
    slower = _log("step=0 loss=0.5 dt=2.00s", "step=1 loss=0.4 dt=2.00s", "step=2 loss=0.3 dt=2.00s")
    deltas = compare(slower, baseline)
    assert any(d.regressed for d in deltas)
    assert finish.judge(slower, deltas=deltas).code == ExitCode.FAILED
    assert finish.judge(slower, deltas=compare(slower, {"report": slower.to_dict()})).code == ExitCode.OK


def test_a_followed_run_s_steps_give_their_own_codes() -> None:
    cases = {
        ExitCode.CONNECT: ("connect", "connect", Outcome("failed", "refused"), "connect"),
        ExitCode.INCONSISTENT: ("workers agree", "preflight", Outcome("failed", "commits differ"), None),
        ExitCode.TIMEOUT: ("follow", "follow", Outcome("timeout", "ran past 60 s"), "timeout"),
        ExitCode.HANG: ("follow", "follow", Outcome("hang", "no step line for 30 s"), "hang"),
        ExitCode.RESOURCE: ("git sync", "git_sync", Outcome("failed", "disk full"), "no_space"),
    }
    for code, step in cases.items():
        assert finish.judge(_log(*STEPS), steps=_steps(step)).code == code, step
    # A job that failed with an out-of-memory in its log: the log's cause, and its fix, named as when followed.
    oom = finish.judge(
        _log(*STEPS, OOM, exit_code=1), steps=_steps(("follow", "follow", Outcome("failed", "exit 1"), None)),
        config="tiny", accelerator="v6e-8",
    )  # fmt: skip
    assert oom.code == ExitCode.OOM and "tpuops fit tiny --accelerator v6e-8" in (oom.hint or "")


def _run(code: ExitCode, log: LogReport | None, run_id: str, **kw: object) -> RunResult:
    return RunResult(SopReport("grpo", run_id, "ssh", [0]), code, log, **kw)  # type: ignore[arg-type]  # kw: its fields


def test_a_bench_s_verdict_is_its_first_variant_that_is_not_ok() -> None:
    ok, oom = _run(ExitCode.OK, _log(*STEPS), "a"), _run(ExitCode.OOM, _log(*STEPS, OOM), "b", hint="fit it")
    assert finish.judge_runs([ok, ok]).code == ExitCode.OK
    verdict = finish.judge_runs([ok, oom, _run(ExitCode.HANG, None, "c")])
    assert (verdict.code, verdict.hint) == (ExitCode.OOM, "fit it")
    lost = _run(ExitCode.PREEMPTED, None, "d", hint="rerun with --recover", vm_lost="v was PREEMPTED")
    assert finish.judge_runs([ok, lost]).error_line() == "v was PREEMPTED (rerun with --recover)"
    blind = finish.judge_runs([ok, _run(ExitCode.OK, None, "e")], need_log=True)  # nothing to compare
    assert blind.code == ExitCode.FAILED and "run e" in (blind.hint or "")
    assert finish.judge_runs([ok, _run(ExitCode.OK, None, "e")]).code == ExitCode.OK


def test_a_run_s_end_is_recorded_only_where_it_started(tpuops_home: Path) -> None:
    rec = {"at": 1.0, "why": "was PREEMPTED", "duration_s": 2.0, "last_step": 4, "resumed_step": 0,
           "steps_lost": 5, "run_id": "r-r1"}  # fmt: skip
    lost = _run(ExitCode.PREEMPTED, None, "r-r1", hint="try another zone", vm_lost="v was lost 2 times",
                recoveries=(rec,))  # fmt: skip
    finish.save(lost)  # no run record: nothing started, nothing to record
    assert not (tpuops_home / "runs" / "r-r1").exists()
    (tpuops_home / "runs" / "r-r1").mkdir(parents=True)
    (tpuops_home / "runs" / "r-r1" / "run.json").write_text("{}")
    finish.save(lost)
    saved = json.loads((tpuops_home / "runs" / "r-r1" / "result.json").read_text())
    assert (saved["exit_code"], saved["error_class"], saved["error"]) == (8, "preempted", "preempted")
    assert saved["message"] == "v was lost 2 times (try another zone)" and saved["recoveries"] == [rec]
