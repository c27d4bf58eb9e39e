"""The bundled trainer as a repository: made from the installed trainer/ reproducibly (the same files give the
same commit in any state home), its pyproject.toml's extras the installed tpuops's own, chosen for a trainer SOP
only where no checkout holds trainer/; the `trainer:` key of a SOP file checked like the others."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tpuops.config import TargetSpec
from tpuops.errors import UsageError
from tpuops.run import bundled
from tpuops.run.prepare import context_defaults
from tpuops.run.tree import repo_home
from tpuops.sop import loader

REPO = Path(__file__).resolve().parents[3]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def test_the_same_trainer_makes_the_same_commit_in_any_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = bundled.make()
    assert bundled.make() == first  # made once, then reused
    monkeypatch.setenv("TPUOPS_HOME", str(tmp_path / "other-home"))
    second = bundled.make()
    assert second.repo != first.repo and second.commit == first.commit
    files = _git(second.repo, "ls-files").splitlines()
    assert "trainer/main.py" in files and "pyproject.toml" in files
    assert any(f.startswith("trainer/configs/") and f.endswith(".yaml") for f in files)
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    src = bundled.source()
    assert (
        src is not None
        and (second.repo / "trainer" / "main.py").read_bytes() == (src / "main.py").read_bytes()
    )
    # The bundle a VM's workers clone from holds that very commit.
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(second.bundle), str(clone)], check=True)
    assert _git(clone, "rev-parse", "HEAD") == first.commit


def test_its_pyproject_declares_the_installed_extras() -> None:
    made = bundled.make()
    project = tomllib.loads((made.repo / "pyproject.toml").read_text())
    ours = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def norm(extras: dict[str, list[str]]) -> dict[str, list[str]]:  # installed metadata sorts specifiers
        return {k: [str(Requirement(r)) for r in v] for k, v in extras.items()}

    assert norm(project["project"]["optional-dependencies"]) == norm(
        {"trainer": ours["trainer"], "tpu": ours["tpu"]}
    )
    assert project["project"]["version"] == made.version
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["trainer*"]


def test_extras_keep_other_markers_and_leave_out_other_extras() -> None:
    requires = [
        "typer>=0.12.5",
        'numpy>=1.26; extra == "trainer"',
        "jax[tpu]>=0.4.35; extra == 'tpu'",
        'tomli>=2; python_version < "3.11" and extra == "trainer"',
        'pytest>=8; extra == "test"',
    ]
    assert bundled.extras(requires) == {
        "trainer": ["numpy>=1.26", 'tomli>=2; python_version < "3.11"'],
        "tpu": ["jax[tpu]>=0.4.35"],
    }


def _checkout(path: Path) -> Path:
    subprocess.run([*GIT, "init", "-q", str(path)], check=True)
    (path / "train.py").write_text("print('mine')\n")
    subprocess.run([*GIT, "-C", str(path), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(path), "commit", "-qm", "base"], check=True)
    return path


def _defaults(cwd: Path, spec: TargetSpec, given: dict[str, object] | None = None) -> dict[str, object]:
    params = loader.load(loader.find("grpo", [loader.sops_dir()])).params
    given = given or {}
    return context_defaults(params, spec, cwd, given=set(given), given_values=given, trainer=True)


def test_a_trainer_sop_in_a_checkout_without_trainer_syncs_the_bundled_one(tmp_path: Path) -> None:
    mine = _checkout(tmp_path / "mine")
    made = bundled.make()
    home = repo_home(bundled.URL)
    local = _defaults(mine, TargetSpec(local=True))
    assert local["repo_url"] == str(made.repo) and local["branch"] == made.commit
    assert "bundle" not in local  # locally the repository itself is the remote
    assert local["repo_dir"] == f"{home}/checkout"
    on_vm = _defaults(mine, TargetSpec(vm="v", zone="us-east1-d"))
    assert on_vm["bundle"] == str(made.bundle) and on_vm["install"] == "pyproject"
    assert on_vm["repo_dir"] == f"{home}/checkout" and on_vm["venv"] == f"{home}/venv"
    with pytest.raises(UsageError, match="bundled trainer has one commit"):
        _defaults(mine, TargetSpec(local=True), {"branch": "dev"})
    named = _defaults(mine, TargetSpec(local=True), {"repo_url": "https://example.com/me/fork.git"})
    assert (
        "bundle" not in named
        and named["repo_dir"] == f"{repo_home('https://example.com/me/fork.git')}/checkout"
    )


def test_a_checkout_that_holds_the_trainer_is_synced_as_before() -> None:
    found = _defaults(REPO, TargetSpec(local=True))
    assert found["repo_url"] == _git(REPO, "rev-parse", "--show-toplevel") and "bundle" not in found
    assert found["branch"] == _git(REPO, "rev-parse", "HEAD")


def test_the_trainer_sops_say_so_and_the_key_is_checked(tmp_path: Path) -> None:
    marked = {name for name in ("grpo", "recompile-check", "gradcheck", "microbench", "job", "smoke", "sync")
              if loader.load(loader.find(name, [loader.sops_dir()])).trainer}  # fmt: skip
    assert marked == {"grpo", "recompile-check", "gradcheck", "microbench"}  # recompile-check: extends grpo
    bad = tmp_path / "mine.yaml"
    bad.write_text("name: mine\ntrainer: sometimes\nsteps: []\n")
    with pytest.raises(UsageError, match=r"mine.yaml:2: trainer: .*sometimes"):
        loader.load(bad)
    bad.write_text("name: mine\ntrainr: true\nsteps: []\n")
    with pytest.raises(UsageError, match=r"unknown key 'trainr'.*did you mean 'trainer'"):
        loader.load(bad)


def test_git_sync_sends_a_bundle_first_and_syncs_from_it() -> None:
    from tpuops.sop.actions import Command, Upload
    from tpuops.sop.model import PlanContext
    from tpuops.sop.steps import GitSync
    from tpuops.transport.base import CmdResult

    made = bundled.make()
    step = GitSync(
        repo=str(made.repo), ref=made.commit, dir="~/tpuops/trainer-1/checkout", bundle=str(made.bundle)
    )
    upload, sync = step.plan(PlanContext(0, 2, "r1", {}))
    assert isinstance(upload, Upload) and isinstance(sync, Command)
    assert (
        upload.local == made.bundle and upload.remote == "~/tpuops/trainer-1/checkout.bundle" and upload.plain
    )
    assert 'repo="$HOME"/tpuops/trainer-1/checkout.bundle;' in sync.script
    # The outcome is the sync's, not the silent upload's before it.
    sent = CmdResult(0, upload.render(), 0)
    synced = CmdResult(0, "sync", 0, stdout=f"tpuops: sha={made.commit[:7]} changed=1\n")
    out = step.outcome([sent, synced])
    assert out.status == "changed" and out.data["sha"] == made.commit[:7]
    unknown = CmdResult(0, "sync", 2, stderr="unknown branch or commit: x (branches and tags found: main)\n")
    with pytest.raises(UsageError, match="unknown branch or commit: x"):
        step.outcome([sent, unknown])
