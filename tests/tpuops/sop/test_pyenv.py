"""The python_env step for real: a venv made with pip, reused while the requirements are unchanged."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

from tpuops.sop.executor import Executor
from tpuops.sop.loader import Sop
from tpuops.transport.local import LocalTransport

PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "proj"
version = "{version}"

[project.optional-dependencies]
tools = []
"""


def test_venv_is_created_then_reused_until_the_requirements_change(tmp_path: Path) -> None:
    t = LocalTransport(tmp_path / "vm")
    proj = t.home(0) / "proj"
    (proj / "proj").mkdir(parents=True)
    (proj / "proj" / "__init__.py").write_text("ANSWER = 42\n")
    (proj / "pyproject.toml").write_text(PYPROJECT.format(version="0.1"))
    sop = Sop.model_validate({"name": "env", "steps": [
        {"kind": "python_env", "repo_dir": "~/proj", "venv": "~/venv", "python": sys.executable, "extras": "tools"},
    ]})  # fmt: skip

    def once(run_id: str):
        report = Executor(t).execute(sop, {}, run_id, [0])
        assert report.ok, report.first_failure()
        return report.steps[0].outcomes[0]

    first = once("r1")
    assert first.status == "changed"  # a new venv, the project installed into it
    versions = first.data["versions"]
    assert versions["python"] == platform.python_version()
    assert versions["jax"] == versions["jaxlib"] == versions["libtpu"] == "-"  # the fresh venv has none
    assert first.detail == f"python={versions['python']} jax=- jaxlib=- libtpu=-"
    venv_python = t.home(0) / "venv" / "bin" / "python"
    imported = subprocess.run(
        [venv_python, "-c", "import proj; print(proj.ANSWER)"], capture_output=True, text=True, check=False
    )
    assert imported.stdout.strip() == "42", imported.stderr

    assert once("r2").status == "nothing"  # same requirements: the venv is reused, nothing installed
    (proj / "pyproject.toml").write_text(PYPROJECT.format(version="0.2"))
    assert once("r3").status == "changed"  # the key (requirements + extras) changed: reinstalled
    show = subprocess.run(
        [venv_python, "-m", "pip", "show", "proj"], capture_output=True, text=True, check=False
    )
    assert "Version: 0.2" in show.stdout, show.stdout + show.stderr
    assert once("r4").status == "nothing"


def test_an_interpreter_older_than_the_project_needs_is_named_before_any_venv_is_made(tmp_path: Path) -> None:
    t = LocalTransport(tmp_path / "vm")
    (t.home(0) / "proj").mkdir(parents=True)
    sop = Sop.model_validate({"name": "env", "steps": [
        {"kind": "python_env", "repo_dir": "~/proj", "venv": "~/venv", "python": sys.executable, "min_python": "99.0"},
    ]})  # fmt: skip
    report = Executor(t).execute(sop, {}, "old", [0])
    outcome = report.steps[0].outcomes[0]
    assert outcome.status == "failed"
    assert outcome.detail == (
        f"{sys.executable} is Python {sys.version_info[0]}.{sys.version_info[1]}; the trainer needs 99.0 or newer: "
        "install it (for example python99.0-venv) and pass --set python=python99.0"
    )
    assert not (t.home(0) / "venv").exists()
