"""`-- CMD` and the user's environment as planned (--dry-run: no network, no worker): the words reach the plan
verbatim and quoted, the environment is chosen from what the checkout has, bad input is exit 2 before anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tpuops.config import TargetSpec
from tpuops.errors import UsageError
from tpuops.run import bench, launch
from tpuops.run.result import Planned
from tpuops.run.tree import repo_home
from tpuops.sop.actions import render_plan

HOSTS = TargetSpec(hosts=("me@10.0.0.2:22", "me@10.0.0.3:22"))


def plan(tmp_path: Path, sop: str, command: tuple[str, ...] = (), **sets: str) -> Planned:
    """The plan of a run from `tmp_path`; the repository is "r" unless `tmp_path` is a checkout (its origin)."""
    own = (tmp_path / ".git").is_dir()
    req = launch.RunRequest(
        sop=sop, sets=sets if own else {"repo_url": "r", **sets}, target=HOSTS, dry_run=True, command=command
    )
    dry = launch.start(req, cwd=tmp_path)
    assert dry.planned is not None and dry.code == 0 and not dry.steps  # a dry run: nothing ran
    return dry.planned


def test_the_command_after_the_dashes_reaches_every_worker_word_for_word(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("WANDB_API_KEY=s3cr3t-value\n")
    words = ("python", "-c", 'print("a b"); $(reboot)', "--set", "lr=1e-4")
    dry = plan(tmp_path, "job", words, env='XLA_FLAGS="--a --b" DEBUG=1', args="--set 'name=my run'")
    text = render_plan(dry.plan)
    assert dry.values["cmd"] == list(words) and dry.values["env"] == ["XLA_FLAGS=--a --b", "DEBUG=1"]
    quoted = (
        """env  '"'"'XLA_FLAGS=--a --b'"'"' DEBUG=1 python -c '"'"'print("a b"); $(reboot)'"'"' """
        """--set lr=1e-4 --set '"'"'name=my run'"'"';"""
    )
    assert text.count(quoted) == 2  # on w0 and w1, inside the detached job's own quoting
    assert (
        "s3cr3t" not in text
    )  # secrets travel in .env (sync_env, sourced by the job), never on a command line
    check = plan(tmp_path, "recompile-check-job", ("python", "t.py"))
    assert "env JAX_LOG_COMPILES=1 JAX_EXPLAIN_CACHE_MISSES=1  python t.py ;" in render_plan(check.plan)


@pytest.mark.parametrize(
    ("sop", "command", "sets", "says"),
    [
        ("grpo", ("python", "x.py"), {}, "SOP grpo takes no command after `--`"),
        ("job", (), {}, "SOP job needs your command after `--`"),
        ("job", ("x",), {"step_pattern": "step (?P<step>"}, "step_pattern 'step (?P<step>' is not a valid"),
        ("job", ("x",), {"step_pattern": r"step (\d+)"}, "has no named group 'step'"),
        ("sync", (), {"step_pattern": "x"}, "step_pattern: SOP sync reads no log"),
        ("job", ("x",), {"env": "A='unbalanced"}, "parameter env is a list of words"),
        ("job", ("x",), {"install": "poetry"}, "parameter install must be one of"),
    ],
)
def test_bad_input_is_exit_2_before_anything_runs(
    tmp_path: Path, sop: str, command: tuple[str, ...], sets: dict[str, str], says: str
) -> None:
    with pytest.raises(UsageError) as e:
        plan(tmp_path, sop, command, **sets)
    assert says in e.value.line()


def _checkout(path: Path, *files: str) -> Path:
    path.mkdir()
    for name in files:
        (path / name).write_text("# nothing\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(path)]
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    subprocess.run([*git, "remote", "add", "origin", "https://example.com/me/project.git"], check=True)
    return path


HOME = repo_home("https://example.com/me/project.git")  # the test checkouts' origin: their home on a worker


def test_the_environment_is_chosen_from_what_the_checkout_has(tmp_path: Path) -> None:
    reqs = _checkout(tmp_path / "reqs", "requirements.txt", "requirements-tpu.txt")
    found = plan(reqs, "job", ("python", "t.py"), branch="main")
    assert (
        found.values["install"] == "requirements"
        and found.values["repo_url"] == "https://example.com/me/project.git"
    )
    assert (
        f"# python environment: venv {HOME}/venv from python3: pip install -r requirements.txt"
        in render_plan(found.plan)
    )
    named = plan(reqs, "job", ("python", "t.py"), branch="main", requirements="requirements-tpu.txt")
    assert "pip install -r requirements-tpu.txt" in render_plan(named.plan)
    uv = _checkout(tmp_path / "uv", "pyproject.toml", "uv.lock")
    assert plan(uv, "job", ("x",), branch="main").values["install"] == "uv"
    interp = plan(reqs, "job", ("x",), branch="main", python="/opt/conda/envs/jax/bin/python")
    assert interp.values["venv"] == "none"  # an interpreter path alone: used as it is
    assert "# python environment: the interpreter /opt/conda/envs/jax/bin/python as it is" in render_plan(
        interp.plan
    )
    newer = plan(reqs, "job", ("x",), branch="main", python="python3.11")
    assert newer.values["venv"] == f"{HOME}/venv"  # a bare name makes the venv, in the repository's own home
    conda = plan(reqs, "job", ("x",), branch="main", conda_env="sglang-jax")
    assert f"# python environment: conda env sglang-jax (linked at {HOME}/venv)" in render_plan(conda.plan)


def test_a_bench_variant_of_a_command_reads_like_a_shell_line() -> None:
    assert bench.command_variant("XLA_FLAGS='--a --b' DEBUG=1 --set bs=16") == (
        ["XLA_FLAGS=--a --b", "DEBUG=1"],
        ["--set", "bs=16"],
    )
    assert bench.command_variant("") == ([], [])
    req = launch.RunRequest(sop="job", sets={"env": "A=1"}, command=("python", "t.py"))
    v = bench.variant_request(req, "B=2 --fast")
    assert v.command == ("python", "t.py", "--fast") and v.sets["env"] == "A=1 B=2"
    with pytest.raises(UsageError, match="--variant"):
        bench.command_variant("A='x")
