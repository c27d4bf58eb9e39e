"""Tables that fit: at 80, 120 and 200 columns every id, zone, name and number the next command needs is whole
(`vm list`, `runs`, `sop list`, `doctor`, the step table of a run, the steps of a log); less important columns
give way first (the caption says which), prose is cut with an ellipsis, nothing else."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tpuops import console
from tpuops.checks.doctor import WorkerHealth, add_fixes
from tpuops.cloud.tpu_api import VmInfo, WorkerAddr
from tpuops.logs.scanner import LogScanner
from tpuops.run import logreport, report, vmview
from tpuops.run.detached import RunState
from tpuops.run.health import Doctored
from tpuops.run.result import RunResult
from tpuops.run.store import RunRecord
from tpuops.sop.executor import SopReport, StepReport
from tpuops.sop.model import Outcome

WIDTHS = (80, 120, 200)


@pytest.fixture(params=WIDTHS)
def width(request: pytest.FixtureRequest) -> Iterator[int]:
    before = console.err.width, console.out.width
    console.err.width = console.out.width = request.param
    yield request.param
    console.err.width, console.out.width = before


def rendered(draw: Callable[[], None]) -> str:
    with console.err.capture() as e, console.out.capture() as o:
        draw()
    text = e.get() + o.get()
    table = [
        line for line in text.splitlines() if line[:1] in "┏┃┡│└"
    ]  # sentences below wrap at the terminal
    assert all(len(line) <= console.err.width for line in table), text
    return text


def whole(text: str, *ids: str) -> None:
    """Each id on one line, uncut (a cut one would show as `us-cent…` or be split over two lines)."""
    for i in ids:
        assert any(i in line for line in text.splitlines()), (i, text)


def test_vm_list(width: int) -> None:
    addr = WorkerAddr(0, "10.0.0.2", None, 22)
    vms = [
        VmInfo("mllm-jax-v5e-256", "europe-west4-b", "p", "READY", "HEALTHY", "v5litepod-256",
               "v2-alpha-tpuv5-lite", True, False, (addr,) * 64),
        VmInfo("ironwood", "us-central1-c", "p", "CREATING", "", "tpu7x-16", "", False, True, (addr,) * 2,
               api="compute", kind="mig"),
    ]  # fmt: skip
    text = rendered(lambda: vmview.vm_list(vms, ["us-central1-c"], False))
    whole(text, "mllm-jax-v5e-256", "europe-west4-b", "us-central1-c", "v5litepod-256",
          "tpu7x-16", "CREATING", " 64 ")  # fmt: skip
    assert ("left out" in text) == (width == 80) and "us-cent…" not in text


def test_runs(width: int) -> None:
    def state(run_id: str, sop: str, vm: str, st: str, detail: str = "") -> RunState:
        return RunState(RunRecord(run_id, sop, {"vm": vm}, [0, 1, 2, 3], {}, 1.7e9), st, detail)

    states = [
        state("20261126-162501-recompile-check-ab12", "recompile-check", "mllm-jax-v6e-8", "running"),
        state("20261125-090000-grpo-cd34", "grpo", "ironwood", "unknown",
              "w0-w3 not reached: connection refused by 10.0.0.2:22 after 3 tries"),
    ]  # fmt: skip
    text = rendered(lambda: report.runs_table(states, False))
    whole(text, "20261126-162501-recompile-check-ab12", "20261125-090000-grpo-cd34", "recompile-check",
          "mllm-jax-v6e-8", "ironwood", "running", "10.0.0.2:22")  # fmt: skip


def test_sop_list(width: int) -> None:
    rows = [
        ("recompile-check", "A few GRPO steps with JAX compile logging; exit 7 if anything compiles after the "
         "warm-up, 13 if no step line or no compile logging was seen", "/site/tpuops/sops/recompile-check.yaml",
         "built-in"),
        ("my-train", "Train", "/home/me/project/sops/my-train.yaml", "user (shadows the built-in)"),
    ]  # fmt: skip
    text = rendered(lambda: report.sop_list(rows, False))
    whole(text, "recompile-check", "my-train")
    if width == 80:
        assert "…" in text and "was seen" not in text  # prose cut with an ellipsis, never mid-word silently
    if width == 200:
        assert "A few GRPO steps with JAX" in text and "/site/tpuops/sops/recompile-check.yaml" in text


def test_doctor_with_its_fix_lines(width: int) -> None:
    health = [
        WorkerHealth(0, "10.128.0.123:22", True, env_keys={"WANDB_API_KEY": "match", "HF_TOKEN": "match"},
                     env_hashes={"WANDB_API_KEY": "1a2b3c4d5e6f", "HF_TOKEN": "0f9e8d7c6b5a"}, lock="absent"),
        WorkerHealth(1, "10.128.0.124:22", True, env_keys={"WANDB_API_KEY": "differs", "HF_TOKEN": "missing"},
                     env_hashes={"WANDB_API_KEY": "99aa88bb77cc"}, lock="present"),
        WorkerHealth(2, "10.128.0.125:22", False, error="connect to 10.128.0.125:22: connection refused"),
    ]  # fmt: skip
    add_fixes(health, "--vm mllm-jax-v6e-8")
    text = rendered(lambda: report.doctor(Doctored(health, []), False))
    whole(
        text, "10.128.0.123:22", "10.128.0.124:22", "1a2b3c4d5e6f", "0f9e8d7c6b5a", "99aa88bb77cc", "present"
    )
    fixes = [line for line in "".join(text.split("\n")).split("fix: ")[1:]]  # a fix line may wrap at 80
    assert len(fixes) == 3
    assert (
        "w1 .env lacks or differs in HF_TOKEN, WANDB_API_KEY: `tpuops sop run sync --vm mllm-jax-v6e-8`"
        in (fixes[0])
    )
    assert "`tpuops sop run lockfile --vm mllm-jax-v6e-8`" in fixes[1] and fixes[2].startswith(
        "w2 not reached"
    )


def test_a_runs_step_table_keeps_the_path_with_its_run_id(width: int) -> None:
    run_id = "20261126-162501-grpo-ab12"
    path = f"~/tpuops/runs/{run_id}/worker-0.log"
    steps = [
        StepReport("git_sync", "git_sync", {w: Outcome("nothing", "at 0123456789ab") for w in (0, 1)}),
        StepReport("start trainer", "run", {w: Outcome("changed", f"started pid 4242, log {path}") for w in (0, 1)}),
    ]  # fmt: skip
    result = RunResult(SopReport("grpo", run_id, "ssh", [0, 1], steps), 0)  # type: ignore[arg-type]
    text = rendered(lambda: report.sop_report(result, False))
    whole(text, run_id, "0123456789ab")
    assert path in text.replace("\n", "").replace("│", "").replace(" ", "") or path in text


def test_a_logs_step_table_keeps_every_number(width: int) -> None:
    scanner = LogScanner()
    for i in range(3):
        scanner.feed(f"step={i} reward_mean=0.1234 entropy=1.2345 dt=0.51s kl_old=0.000123 clip_frac=0.0123 "
                     "grad_norm=12.3456 tokens_per_s=123456.7 rollout_generate=0.25s update=0.25s loss=-0.000123")  # fmt: skip
    text = rendered(lambda: console.err.print(logreport.steps_table(scanner.close())))
    whole(text, "0.1234", "1.2345", "0.51")
    for shown in ("123456.7", "12.3456"):  # a number is shown whole or its column is left out
        assert shown in text or "left out" in text
    if width == 200:
        assert "left out" not in text
