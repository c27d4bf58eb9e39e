"""The python_env step for real: a venv made with pip, reused while the requirements are unchanged."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert first.detail == f"python={versions['python']} jax=- jaxlib=- libtpu=- env=pyproject"
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
        f"{sys.executable} is Python {sys.version_info[0]}.{sys.version_info[1]}; this project needs 99.0 or newer: "
        "install it (for example python99.0-venv) and pass --set python=python99.0"
    )
    assert not (t.home(0) / "venv").exists()


def _env_step(t: LocalTransport, run_id: str, phases: list[str] | None = None, **fields: str):
    sop = Sop.model_validate({"name": "env", "steps": [
        {"kind": "python_env", "repo_dir": "~/proj", "venv": "~/venv", "python": sys.executable, **fields},
    ]})  # fmt: skip
    seen = phases if phases is not None else []
    executor = Executor(t, on_phase=lambda w, title, kind, state: seen.append(state))
    return executor.execute(sop, {}, run_id, [0]).steps[0].outcomes[0]


@pytest.mark.slow
def test_a_repository_with_only_requirements_files_gets_a_venv_from_the_one_named(tmp_path: Path) -> None:
    t = LocalTransport(tmp_path / "vm")
    proj = t.home(0) / "proj"
    (proj / "vendored" / "tinyreq" / "tinyreq").mkdir(parents=True)
    (proj / "vendored" / "tinyreq" / "tinyreq" / "__init__.py").write_text("ANSWER = 7\n")
    (proj / "vendored" / "tinyreq" / "pyproject.toml").write_text(
        PYPROJECT.replace('name = "proj"', 'name = "tinyreq"').format(version="1.0")
    )
    (proj / "requirements.txt").write_text("# the CPU set: nothing\n")
    (proj / "requirements-tpu.txt").write_text("./vendored/tinyreq\n")
    auto = _env_step(t, "r1", min_python="")  # no pyproject at the top: requirements.txt, as found
    assert auto.status == "changed" and auto.data["env"] == "requirements", auto.detail
    phases: list[str] = []
    named = _env_step(
        t, "r2", phases, min_python="", install="requirements", requirements="requirements-tpu.txt"
    )
    assert named.status == "changed" and named.detail.endswith("env=requirements"), named.detail
    # The live status line hears what pip is doing, package by package, then the step's end.
    assert phases[0] == "begin" and phases[-1] == "changed", phases
    assert "doing collecting tinyreq" in phases and "doing installing tinyreq" in phases, phases
    venv_python = t.home(0) / "venv" / "bin" / "python"
    got = subprocess.run(
        [venv_python, "-c", "import tinyreq; print(tinyreq.ANSWER)"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert got.stdout.strip() == "7", got.stderr
    missing = _env_step(t, "r3", min_python="", install="requirements", requirements="requirements-gpu.txt")
    assert (
        missing.status == "failed"
        and missing.detail == "requirements file requirements-gpu.txt is not in the checkout"
    )


def test_a_conda_env_is_used_as_it_is_through_a_link_at_the_venv_path(tmp_path: Path) -> None:
    t = LocalTransport(tmp_path / "vm")
    home = t.home(0)
    (home / "proj").mkdir(parents=True)
    env_bin = home / "miniconda3" / "envs" / "sglang-jax" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "python").symlink_to(sys.executable)
    (home / "venv").mkdir()
    (home / "venv" / ".tpuops-key").write_text("old\n")  # a venv an earlier run made: made again when needed
    got = _env_step(t, "c1", conda_env="sglang-jax")
    assert got.status == "nothing" and got.data["env"] == "conda", got.detail
    assert (home / "venv").readlink() == (home / "miniconda3" / "envs" / "sglang-jax")
    assert got.data["versions"]["python"] == platform.python_version()
    # A venv tpuops makes next never installs into the conda env: the link goes, a real venv comes.
    (home / "mine").mkdir()
    refused = _env_step(t, "c2", conda_env="sglang-jax", venv="~/mine")
    assert refused.status == "failed" and "~/mine exists and is not a venv tpuops made" in refused.detail
    unknown = _env_step(t, "c3", conda_env="nope")
    assert unknown.status == "failed" and unknown.detail.startswith("conda env nope not found on this worker")


def test_uv_lock_without_uv_says_what_to_do_and_an_interpreter_path_is_used_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = LocalTransport(tmp_path / "vm")
    proj = t.home(0) / "proj"
    proj.mkdir(parents=True)
    (proj / "pyproject.toml").write_text(PYPROJECT.format(version="0.1"))
    (proj / "uv.lock").write_text("version = 1\n")
    # A worker without uv: this machine's PATH less every folder that has one (the test extra installs uv).
    path = [d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "uv").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    got = _env_step(t, "u1", min_python="")
    assert got.status == "failed"
    assert got.detail.startswith("the repository has uv.lock but uv is not on the worker's PATH"), got.detail
    as_is = _env_step(t, "u2", venv="none")
    assert as_is.status == "nothing" and as_is.data["env"] == "python" and not (t.home(0) / "venv").exists()


UV_PROJECT = """[project]
name = "proj"
version = "0.1"
requires-python = ">=3.10"
dependencies = []

[project.optional-dependencies]
tools = []

[tool.uv]
package = false
"""


@pytest.mark.slow
def test_a_repository_with_uv_lock_gets_its_venv_from_uv_sync_and_keeps_it_while_the_lock_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    assert Path(uv).exists(), "uv is in the test extra (pyproject.toml)"
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(uv).parent), os.environ["PATH"]]))
    monkeypatch.setenv("UV_OFFLINE", "1")  # nothing downloads: the project has no dependencies to fetch
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # uv's lock file for the environment (uv-HASH.lock) goes here
    t = LocalTransport(tmp_path / "vm")
    proj = t.home(0) / "proj"
    proj.mkdir(parents=True)
    (proj / "pyproject.toml").write_text(UV_PROJECT)
    subprocess.run([uv, "lock", "-q"], cwd=proj, check=True, capture_output=True)  # the user's own lock
    assert 'source = { virtual = "." }' in (proj / "uv.lock").read_text()

    first = _env_step(t, "v1", extras="tools", min_python="")
    assert first.status == "changed" and first.data["env"] == "uv", first.detail
    assert first.data["versions"]["python"] == platform.python_version()
    venv = t.home(0) / "venv"
    assert (venv / "pyvenv.cfg").read_text().count("uv = ") == 1  # made by uv sync, not python -m venv
    ran = subprocess.run([venv / "bin" / "python", "-c", "import sys; print(sys.prefix)"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert Path(ran.stdout.strip()) == venv
    again = _env_step(t, "v2", extras="tools", min_python="")
    assert again.status == "nothing" and again.data["env"] == "uv", again.detail  # the same lock: reused
    (proj / "pyproject.toml").write_text(UV_PROJECT.replace('version = "0.1"', 'version = "0.2"'))
    subprocess.run([uv, "lock", "-q"], cwd=proj, check=True, capture_output=True)
    assert _env_step(t, "v3", extras="tools", min_python="").status == "changed"  # a new lock: synced again


def test_empty_extras_install_the_project_itself() -> None:
    from tpuops.sop.model import PlanContext
    from tpuops.sop.pyenv import PythonEnv

    (cmd,) = PythonEnv(extras="", install="pyproject").plan(PlanContext(0, 1, "r", {}))
    assert 'if [ -n "$extras" ]; then spec=".[$extras]"; else spec=.; fi' in cmd.render()
    assert (
        "extras=''" in cmd.render()
        and "# python environment: venv ~/tpuops/venv from python3: pip install -e" in cmd.render()
    )
