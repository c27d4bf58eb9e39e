"""Every outcome status renders in both outputs: the people's table (rich markup) and --json."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from tpuops import console
from tpuops.errors import ExitCode
from tpuops.run import report
from tpuops.run.result import RunResult
from tpuops.sop.executor import SopReport, StepReport
from tpuops.sop.model import Outcome
from tpuops.sop.status import FAILED, Status


@pytest.mark.parametrize("status", list(Status))
def test_every_status_renders_for_people_and_in_json(status: Status, monkeypatch: pytest.MonkeyPatch) -> None:
    err, out = io.StringIO(), io.StringIO()
    monkeypatch.setattr(report, "err", Console(file=err, width=200, highlight=False, soft_wrap=True))
    monkeypatch.setattr(console, "out", Console(file=out, width=200, highlight=False, soft_wrap=True))
    step = StepReport("follow", "follow", outcomes={0: Outcome(status, "[/] brackets [bold]stay text")})
    code = ExitCode.HANG if status in FAILED else ExitCode.OK
    rep = RunResult(SopReport("job", "r1", "ssh", [0], steps=[step]), code)
    report.sop_report(rep, as_json=False)
    text = err.getvalue()
    assert f"│ {status} [/] brackets [bold]stay text" in text and f"exit code {int(code)}" in text, text
    report.step_done(step)
    assert f"({status}, " in err.getvalue()
    report.sop_report(rep, as_json=True)
    data = json.loads(out.getvalue())
    assert data["steps"][0]["workers"]["0"]["status"] == status
    assert data["failure"] == (None if status not in FAILED or status == "cancelled" else data["failure"])


def test_every_status_has_its_own_style() -> None:
    assert set(console._STYLE) == set(Status)  # status cells are styled in console.py since the move


def test_a_recovery_says_where_the_run_stood_and_never_prints_none(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(report, "err", Console(file=err, width=200, highlight=False, soft_wrap=True))
    known = {"why": "was PREEMPTED", "duration_s": 3.5, "last_step": 7, "resumed_step": 5, "steps_lost": 3}
    # Lost before any step line: nothing is known of where it stood, where it resumed or what it lost.
    early = {**known, "last_step": None, "resumed_step": None, "steps_lost": None}
    rep = RunResult(SopReport("grpo", "r1", "ssh", [0, 1], steps=[]), ExitCode.OK, recoveries=(known, early))
    report.sop_report(rep, as_json=False)
    text = err.getvalue()
    assert (
        "recovered: the VM was PREEMPTED at step 7; 3.5s to recreate, resumed at step 5, steps lost 3" in text
    )
    assert (
        "recovered: the VM was PREEMPTED before its first step line; 3.5s to recreate, no step line after it, "
        "steps lost unknown" in text
    )
    assert "None" not in text
