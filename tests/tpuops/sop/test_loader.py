"""SOP files are validated on load: unknown keys and kinds, bad YAML, unknown parameters, typed --set values."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuops.errors import UsageError
from tpuops.sop import loader


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return p


GOOD = """\
name: t
description: test
params:
  branch: {type: str, default: main}
  steps: {type: int, default: 3}
steps:
  - kind: git_sync
    repo: /r
    ref: "{branch}"
  - kind: shell
    command: "echo {steps}"
"""


def test_good_sop_loads_with_typed_params(tmp_path: Path) -> None:
    sop = loader.load(write(tmp_path, GOOD))
    assert [s.kind for s in sop.steps] == ["git_sync", "shell"]
    assert sop.resolve({"steps": "20"}) == {"branch": "main", "steps": 20}


def test_unknown_step_key_names_file_line_and_close_match(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("    ref:", "    reff:"))
    with pytest.raises(UsageError) as e:
        loader.load(p)
    assert e.value.line() == f"{p}:9: unknown key 'reff' at steps.0.reff; did you mean 'ref'?"


def test_unknown_kind_suggests_the_closest(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("kind: shell", "kind: shel"))
    with pytest.raises(UsageError) as e:
        loader.load(p)
    assert f"{p}:10:" in e.value.line() and "did you mean 'shell'?" in e.value.line()


def test_unknown_top_level_key(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("description:", "descripton:"))
    with pytest.raises(
        UsageError, match=r"bad.yaml:2: unknown key 'descripton' .*did you mean 'description'"
    ):
        loader.load(p)


def test_yaml_error_has_the_line(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("  - kind: shell", "  - kind: [shell"))
    with pytest.raises(UsageError, match=r"bad.yaml:1[0-9]: invalid YAML"):
        loader.load(p)


def test_template_must_name_a_declared_parameter(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace('"echo {steps}"', '"echo {stepz}"'))
    with pytest.raises(UsageError, match=r"uses \{stepz\}, which is not a parameter; did you mean 'steps'"):
        loader.load(p)


def test_set_values_are_type_checked_and_unknown_keys_suggested(tmp_path: Path) -> None:
    sop = loader.load(write(tmp_path, GOOD))
    with pytest.raises(UsageError, match=r"parameter steps must be int, received 'many'"):
        sop.resolve({"steps": "many"})
    with pytest.raises(UsageError, match=r"unknown parameter 'step' for SOP t; did you mean 'steps'"):
        sop.resolve({"step": "1"})


def test_required_parameter_is_named(tmp_path: Path) -> None:
    sop = loader.load(loader.find("sync"))
    with pytest.raises(UsageError, match=r"needs parameter 'repo_url'"):
        sop.resolve({})


def test_every_bundled_sop_loads() -> None:
    names = [row[0] for row in loader.list_sops()]
    assert {"sync", "smoke", "lockfile", "exec"} <= set(names)
    for name in names:
        assert loader.load(loader.find(name)).steps


def test_missing_sop_lists_known_ones() -> None:
    with pytest.raises(UsageError, match=r"no SOP named 'synk'; did you mean 'sync'"):
        loader.find("synk")


def test_sop_list_shows_the_valid_sops_and_each_broken_file_with_its_error(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    (tmp_path / "sops").mkdir()
    (tmp_path / "sops" / "typo.yaml").write_text("name: typo\nsteps:\n  - kind: shel\n    command: x\n")
    (tmp_path / "sops" / "cut.yaml").write_text("name: cut\nsteps: [\n")
    tpuops = [sys.executable, "-m", "tpuops", "sop", "list"]
    people = subprocess.run(tpuops, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert people.returncode == 2
    assert "sync" in people.stdout and "smoke" in people.stdout  # the valid ones are still listed
    broken = [ln for ln in people.stderr.splitlines() if ln.startswith("broken SOP")]
    assert len(broken) == 2
    assert "typo.yaml:3: steps[0] has unknown kind 'shel'; did you mean 'shell'?" in people.stderr
    assert "cut.yaml:3: invalid YAML" in people.stderr
    as_json = subprocess.run([*tpuops, "--json"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert as_json.returncode == 2
    rows = {r["name"]: r for r in json.loads(as_json.stdout)}
    assert rows["sync"]["error"] is None and "unknown kind 'shel'" in rows["typo"]["error"]
