"""libtpu's megascale hang and error abort: in a multislice job's LIBTPU_INIT_ARGS by default (a dry run of `grpo`
on an emulated 2 x v4-16, its start step against a golden file), never on one slice, off with
`--set megascale_abort=false`; a job's own LIBTPU_INIT_ARGS come after the flags, so they can still turn one off."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tests.tpuops.cloud.test_multislice import _create
from tests.tpuops.cloud.test_recovery import ZONE, _vm
from tpuops.config import TargetSpec
from tpuops.run import launch
from tpuops.sop.actions import Command, render_plan
from tpuops.sop.libtpu import HANG_ABORT_FLAGS, export
from tpuops.sop.model import PlanContext

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "grpo-multislice-start.txt"
FLAGS = " ".join(HANG_ABORT_FLAGS)


def _start_step(cloud: Cloud, vm: str, cwd: Path, **sets: str) -> str:
    """The `start trainer` step of a `grpo` dry run on the VM, every worker's command in full."""
    spec = TargetSpec(vm=vm, zone=ZONE, api_endpoint=cloud.url, identity=str(cloud.identity))
    base = {
        "repo_url": "https://github.com/example/mllm-jax.git",
        "branch": "main",
        "coordinator_port": "8476",
    }
    req = launch.RunRequest(sop="grpo", sets={**base, **sets}, target=spec, dry_run=True, skip_fit=True)
    result = launch.start(req, cwd=cwd)
    assert result.planned is not None and result.code == 0
    (step,) = [(t, per) for t, per in result.planned.plan if t == "start trainer"]
    return render_plan([step])


def test_a_multislice_job_gets_the_hang_abort_and_can_turn_it_off(
    cloud: Cloud, vm_name: str, tmp_path: Path
) -> None:
    _create(cloud, vm_name)  # 2 slices of v4-16: 4 workers
    text = _start_step(cloud, vm_name, tmp_path)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), (
        "the multislice start step changed; review it and rerun with UPDATE_GOLDEN=1"
    )
    starts = [ln for ln in text.splitlines() if "setsid nohup sh -c" in ln]
    assert len(starts) == 4 and all(FLAGS in ln for ln in starts)
    assert "MEGASCALE_NUM_SLICES" in text  # the multislice's own variables, by name (values over stdin)

    off = _start_step(cloud, vm_name, tmp_path, megascale_abort="false")
    assert "megascale_error_reporter" not in off and "MEGASCALE_NUM_SLICES" in off


def test_one_slice_gets_no_hang_abort_flags(cloud: Cloud, vm_name: str, tmp_path: Path) -> None:
    _vm(cloud, vm_name, "v4-16")
    assert "megascale_error_reporter" not in _start_step(cloud, vm_name, tmp_path)


@pytest.mark.parametrize(
    ("own", "expected"),
    [
        (None, FLAGS),
        ("--xla_foo=1 --megascale_error_reporter_abort_on_hang=false", f"{FLAGS} --xla_foo=1 "
         "--megascale_error_reporter_abort_on_hang=false"),
    ],
)  # fmt: skip
def test_the_flags_come_before_the_jobs_own_libtpu_init_args(own: str | None, expected: str) -> None:
    """Run by sh as the job's shell runs it: the job's own flags (its .env's) last, where libtpu's parser lets the
    last one win."""
    ctx = PlanContext(0, 4, "r", {}, slice_id=1, num_slices=2)
    script = f'{export(ctx, "true")} printf %s "$LIBTPU_INIT_ARGS"'
    env = {k: v for k, v in os.environ.items() if k != "LIBTPU_INIT_ARGS"}
    if own is not None:
        env["LIBTPU_INIT_ARGS"] = own
    got = subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, check=True, timeout=10
    )
    assert got.stdout == expected
    assert export(ctx, "false") == "" and export(PlanContext(0, 2, "r", {}), "true") == ""
    with pytest.raises(ValueError, match="megascale_abort must be true or false, received 'maybe'"):
        export(ctx, "maybe")


def test_the_run_step_passes_the_setting_to_the_job_script() -> None:
    """The run step's template: `{megascale_abort}` from the SOP's parameter."""
    from tpuops.sop.runs import Run

    ctx = PlanContext(0, 4, "r", {"m": True}, slice_id=0, num_slices=2)
    (cmd,) = Run(command="true", megascale_abort="{m}").plan(ctx)
    assert isinstance(cmd, Command) and FLAGS in cmd.script
