"""The user config: the project's tpuops.toml over ~/.config/tpuops/config.toml; unknown keys are errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tpuops import config
from tpuops.errors import UsageError
from tpuops.run import launch
from tpuops.sop.actions import render_plan


def test_project_file_overrides_user_file_and_feeds_sop_defaults(tmp_path: Path) -> None:
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "tpuops" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text('zone = "us-central2-b"\nuser = "me"\n[params]\nbranch = "dev"\nrepo_dir = "~/a"\n')
    project = tmp_path / "proj"
    (project / "sub").mkdir(parents=True)
    (project / "tpuops.toml").write_text(
        'zone = "us-east1-d"\n[params]\nbranch = "release"\nrepo_url = "https://x/y.git"\n'
    )
    cfg = config.load(project / "sub")  # found walking up
    assert (cfg.zone, cfg.user) == ("us-east1-d", "me")
    assert cfg.params == {"branch": "release", "repo_dir": "~/a", "repo_url": "https://x/y.git"}
    result = launch.run(
        launch.RunRequest(sop="sync", target=launch.TargetSpec(hosts=("10.0.0.2",)), dry_run=True),
        cwd=project / "sub",
    )
    plan = render_plan(result.plan)
    assert "repo=https://x/y.git; ref=release" in plan
    assert 'dir="$HOME"/a;' in plan
    assert (
        launch.open_transport(launch.resolve(launch.TargetSpec(hosts=("10.0.0.2",)), cfg)).workers[0].user
        == "me"
    )


def test_unknown_key_names_the_closest(tmp_path: Path) -> None:
    (tmp_path / "tpuops.toml").write_text('zonee = "x"\n')
    with pytest.raises(UsageError, match=r"tpuops.toml: unknown key 'zonee'; did you mean 'zone'\?"):
        config.load(tmp_path)
