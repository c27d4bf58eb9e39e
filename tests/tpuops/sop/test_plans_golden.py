"""Golden --dry-run plans for every bundled SOP: the exact commands each worker would get, with no network."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tpuops.config import TargetSpec
from tpuops.run import launch
from tpuops.sop import loader
from tpuops.sop.actions import render_plan

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
# Fixed values so the plans do not depend on this checkout or machine.
SETS = {"repo_url": "https://github.com/example/mllm-jax.git", "branch": "main", "cmd": "hostname"}
HOSTS = ("me@10.0.0.2:22", "me@10.0.0.3:22")


@pytest.mark.parametrize("name", [row[0] for row in loader.list_sops()])
def test_dry_run_plan_matches_golden(name: str, tmp_path: Path) -> None:
    sop = loader.load(loader.find(name))
    sets = {k: v for k, v in SETS.items() if k in sop.params}
    result = launch.start(
        launch.RunRequest(sop=name, sets=sets, target=TargetSpec(hosts=HOSTS), dry_run=True), cwd=tmp_path
    )
    assert result.planned is not None and result.code == 0 and not result.steps  # a dry run: nothing ran
    text = render_plan(result.planned.plan)
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text(), f"plan of {name} changed; review it and rerun with UPDATE_GOLDEN=1"
    assert "[w0]" in text and "[w1]" in text


def test_dry_run_touches_nothing(tmp_path: Path) -> None:
    # Unreachable hosts: a dry run must not even try to connect.
    spec = TargetSpec(hosts=("me@192.0.2.1:22",))
    result = launch.start(
        launch.RunRequest(sop="sync", sets={"repo_url": "x"}, target=spec, dry_run=True), cwd=tmp_path
    )
    assert result.planned is not None
    assert not (Path(os.environ["TPUOPS_HOME"]) / "runs").exists()


def test_hostile_value_is_quoted_in_the_plan(tmp_path: Path) -> None:
    sets = {"repo_url": "r", "branch": "x; rm -rf /", "repo_dir": "~/$(reboot)"}
    result = launch.start(
        launch.RunRequest(sop="sync", sets=sets, target=TargetSpec(hosts=HOSTS[:1]), dry_run=True),
        cwd=tmp_path,
    )
    assert result.planned is not None
    text = render_plan(result.planned.plan)
    assert "ref='x; rm -rf /'" in text
    assert "dir=\"$HOME\"/'$(reboot)'" in text
