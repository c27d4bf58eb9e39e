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


@pytest.mark.parametrize("name", ["job", "grpo"])
def test_the_plan_people_read_is_one_line_per_step_per_worker(name: str, tmp_path: Path) -> None:
    """`--dry-run` prints one line per step per worker, each saying what the step does; `--verbose` prints the
    golden plan (every command in full, as the workers would get it)."""
    import subprocess
    import sys

    sets = {k: v for k, v in SETS.items() if k != "cmd"}
    argv = [sys.executable, "-m", "tpuops", "run", name, *(a for h in HOSTS for a in ("--host", h))]
    argv += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")] + ["--dry-run", "--offline"]
    tail = ["--", "hostname"] if name == "job" else []
    short = subprocess.run(
        [*argv, *tail], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert short.returncode == 0, short.stderr
    lines = short.stdout.splitlines()
    steps = ["run lock", "checks", *(s.title for s in loader.load(loader.find(name)).steps)]
    assert [ln.split(": ", 1)[0] for ln in lines] == [f"[w{w}] {s}" for s in steps for w in (0, 1)]
    said = dict(ln.split(": ", 1) for ln in lines)
    assert (
        said["[w1] git_sync"]
        == "check out main of https://github.com/example/mllm-jax.git in ~/tpuops/mllm-jax-313b9b99/checkout"
        " (local edits stashed first)"
    )
    start = next(v for k, v in said.items() if k.startswith("[w1] start"))
    assert (
        start.startswith("start in the background in ~/tpuops/mllm-jax-313b9b99/checkout: ")
        and "(log ~/tpuops/runs/DRY-RUN/worker-1.log)" in start
    )
    assert ("env hostname" if name == "job" else '"$py" -m trainer.main --config arith') in start
    full = subprocess.run(
        [*argv, "--verbose", *tail], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert full.returncode == 0 and full.stdout == (GOLDEN / f"{name}.txt").read_text()
    assert len(lines) * 20 < len(full.stdout.splitlines())
