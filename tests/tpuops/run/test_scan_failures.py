"""logscan's failures: tracebacks, the failure signatures and the lines that only look like one, the bound on
kept failures, and which failure a run's cause is."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tpuops.run.test_scan import scan, step_line
from tpuops.logs import events
from tpuops.run import scan as scanner_module
from tpuops.run.scan import LogScanner


def test_traceback_reports_last_frame_and_error_line() -> None:
    lines = [
        step_line(0, 1.0),
        "Traceback (most recent call last):",
        '  File "/repo/trainer/main.py", line 10, in <module>',
        "    run()",
        '  File "/repo/trainer/train.py", line 99, in run',
        "    state = update(state, batch)",
        "            ^^^^^^^^^^^^^^^^^^^^",
        "ValueError: shapes (3,) and (4,) do not match",
        "--------------------",
    ]
    (f,) = scan(lines, worker=2).failures
    assert (f.kind, f.worker, f.line) == ("traceback", 2, 8)
    assert f.message == "ValueError: shapes (3,) and (4,) do not match"
    assert f.detail == "/repo/trainer/train.py:99 in run: state = update(state, batch)"


def test_a_log_cut_inside_a_traceback_still_reports_it() -> None:
    r = scan(["Traceback (most recent call last):", '  File "/repo/x.py", line 3, in f', "    g()"])
    assert [(f.kind, f.detail) for f in r.failures] == [("traceback", "/repo/x.py:3 in f: g()")]


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 1.00GiB", "oom"),
        ("E1122 tpu_compile.cc:12] ran out of memory in memory space hbm", "oom"),
        (
            "RuntimeError: Unable to initialize backend 'tpu': The TPU is already in use by pid 4242",
            "tpu_busy",
        ),
        ("open(/dev/vfio/0): Device or resource busy", "tpu_busy"),
        (
            'ABORTED: The TPU is already in use by another process. Run "$ sudo lsof -w /dev/vfio/0"',
            "tpu_busy",
        ),
        ("tpuops: TPU is held by pid 77 (python3 -m trainer.main)", "tpu_busy"),
        ("wandb: ERROR api_key not configured (no-tty). call wandb.login(key=[your_api_key])", "wandb_init"),
        ("wandb.errors.errors.CommError: Run initialization has timed out after 90.0 sec.", "wandb_init"),
        (
            "jax.errors.JaxRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Id: PjRT_Client_Connect",
            "multihost",
        ),
        ("Failed to connect to coordination service at 10.0.0.2:8476: UNAVAILABLE", "multihost"),
    ],
)
def test_failure_signatures(line: str, kind: str) -> None:
    r = scan([step_line(0, 1.0), line], worker=1)
    assert [(f.kind, f.worker, f.line, f.message) for f in r.failures] == [(kind, 1, 2, line)]
    assert r.failed and r.failure_counts == {kind: 1}


def test_benign_lines_are_not_failures() -> None:
    r = scan(
        [
            "wandb: url=https://wandb.ai/me/proj/runs/abc",
            "wandb: 🚀 View run fancy-fire-1 at: https://wandb.ai/me/proj/runs/xyz",
            "reward_errors step=3 name=correctness count=2",
            "reward_errors step=4 name=correctness count=1",
            "checkpoint step=10 path=/ckpt/10",
            'summary: {"steps": 20, "dt_p50": 1.2}',
            'metrics: {"kind": "gradcheck", "max_abs": 1e-6}',
            'config: {"model": {"name": "tiny"}}',
            "start: backend=cpu process_count=2 process_index=0 device_count=8 mesh=dp:1,fsdp:4,tp:2",
            "batch: prompts_per_step=4 samples_per_prompt=4",
        ]
    )
    assert not r.failures
    assert r.wandb_url == "https://wandb.ai/me/proj/runs/xyz"
    assert r.reward_errors == {"correctness": 3}
    assert (r.checkpoints, r.last_checkpoint) == (1, "/ckpt/10")
    assert r.summary == {"steps": 20, "dt_p50": 1.2} and r.metrics == [{"kind": "gradcheck", "max_abs": 1e-6}]
    assert r.config == {"model": {"name": "tiny"}} and r.start["process_count"] == "2"
    assert r.batch == {"prompts_per_step": "4", "samples_per_prompt": "4"}


def test_an_unrelated_port_clash_is_not_a_busy_tpu() -> None:
    assert not scan(["bind: Address already in use (port 6006, tensorboard)"]).failures


def test_kept_failures_are_bounded_but_counted_exactly(tmp_path: Path) -> None:
    for k, n in ((0, 5), (1, 300)):
        (tmp_path / f"worker-{k}.log").write_text("RESOURCE_EXHAUSTED: out of HBM\n" * n)
        (tmp_path / f"worker-{k}.exit").write_text("1")
    r = scanner_module.scan_run(tmp_path)
    assert len(r.failures) == events.MAX_EVENTS + 1  # the exit codes are kept past the bound
    assert [(f.kind, f.worker) for f in r.failures if f.kind != "oom"] == [("exit_code", 0), ("exit_code", 1)]
    assert r.failure_counts == {"oom": 305, "exit_code": 2}


def _cause(lines: list[str], exit_code: int | None = 1) -> str | None:
    scanner = LogScanner(warmup=0)
    for line in lines:
        scanner.feed(line)
    report = scanner.close()
    scanner_module.apply_exit(report, 0, exit_code)
    cause = report.cause()
    return None if cause is None else cause.kind


OOM_TRACEBACK = [
    "step=0 loss=0.1 dt=1.00s",
    "Traceback (most recent call last):",
    '  File "/w/trainer/train.py", line 300, in run',
    "    state = update(state, batch)",
    "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8.00GiB.",
]


def test_the_most_specific_failure_is_the_cause_whatever_came_first() -> None:
    assert _cause(OOM_TRACEBACK) == "oom"  # the traceback is recorded first; the OOM inside it wins
    assert _cause([*OOM_TRACEBACK[:-1], "ValueError: my bug"]) == "traceback"  # over "exited 1"
    assert _cause(["step=0 dt=1.00s"]) == "exit_code"
    assert _cause(["step=0 dt=1.00s"], exit_code=0) is None
    assert _cause(["RuntimeError: The TPU is already in use by process with pid 4242", *OOM_TRACEBACK[1:4],
                   "ValueError: x"]) == "tpu_busy"  # fmt: skip
