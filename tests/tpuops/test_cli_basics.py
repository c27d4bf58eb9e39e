"""The basics people expect of a CLI: --version, -h, completion, a SOP's own --help, clear option mistakes,
IDs that tables never cut, and `tpuops logs` on stdout for pipes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tpuops.errors import ExitCode

REPO = Path(__file__).resolve().parents[2]


def tpuops(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "100", **env}, check=False,
    )  # fmt: skip


def test_version_and_short_help(tmp_path: Path) -> None:
    r = tpuops("--version", cwd=tmp_path)
    # Run from this git checkout: the version with the commit checked out (as `git rev-parse --short=7 HEAD`).
    head = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert r.returncode == 0 and r.stdout.strip() == f"tpuops {version('tpuops')}+g{head}"
    assert tpuops("-V", cwd=tmp_path).stdout == r.stdout
    short, long = tpuops("vm", "list", "-h", cwd=tmp_path), tpuops("vm", "list", "--help", cwd=tmp_path)
    assert short.returncode == 0 and short.stdout == long.stdout and "vm list [OPTIONS]" in short.stdout


def test_root_help_lists_whole_sentences(tmp_path: Path) -> None:
    """No description cut with "..." mid-sentence in `tpuops --help`."""
    out = tpuops("--help", cwd=tmp_path).stdout
    commands = out.split("Commands:", 1)[1]
    assert "..." not in commands and "logs             Print a run's worker logs on stdout" in commands


def test_run_help_lists_the_sops_own_parameters(tmp_path: Path) -> None:
    r = tpuops("run", "grpo", "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    params = r.stdout.split("Parameters of SOP grpo", 1)[1]
    lines = {ln.split()[0]: ln for ln in params.splitlines()[1:] if ln.startswith("  ") and ln.split()}
    assert lines["steps"].split()[1] == "INT" and "GRPO steps" in lines["steps"]
    assert lines["config"].split()[1] == "STR" and "trainer config preset" in lines["config"]
    assert "[default: arith]" in params.split("  config ", 1)[1].split("\n  coordinator_port", 1)[0]
    # The same rows with the SOP named after options, and for a command that always runs one SOP.
    assert "Parameters of SOP grpo" in tpuops("run", "--local", "grpo", "-h", cwd=tmp_path).stdout
    fixed = tpuops("recompile-check", "-h", cwd=tmp_path).stdout
    assert "Parameters of SOP recompile-check" in fixed and "\n  steps INT" in fixed
    assert "name a SOP to list its parameters" in tpuops("run", "-h", cwd=tmp_path).stdout
    unknown = tpuops("run", "nosuchsop", "-h", cwd=tmp_path)
    assert unknown.returncode == 0 and "nosuchsop" in unknown.stdout.split("Parameters of SOP", 1)[1]


def test_metavars_are_gcloud_style(tmp_path: Path) -> None:
    out = tpuops("run", "--help", cwd=tmp_path).stdout
    for shown in ("--set KEY=VALUE", "--zone ZONE", "--vm NAME", "--host USER@IP[:PORT]", "--parallel N"):
        assert shown in out, shown
    assert "<" not in out.split("Options:", 1)[1]  # no <list[str]> / <str>
    # Positional arguments too: named by their metavar, `...` for one that takes several words.
    for argv in (["run", "--help"], ["sop", "run", "--help"], ["fit", "--help"]):
        args = tpuops(*argv, cwd=tmp_path).stdout.split("Arguments:", 1)[1].split("Options:", 1)[0]
        assert "<" not in args, (argv, args)
    assert "CMD ARGS ..." in tpuops("sop", "run", "--help", cwd=tmp_path).stdout


@pytest.mark.parametrize(
    "argv, says",
    [
        (["run", "grpo", "--vm", "--zone", "z"], "--vm needs a value (--vm NAME), but the next word is the option --zone"),
        (["run", "grpo", "--set", "steps", "3"], "--set takes KEY=VALUE, got 'steps': write --set steps=3"),
        (["sop", "run", "exec", "-s", "cmd", "--local"], "--set takes KEY=VALUE, got 'cmd': write --set cmd=..."),
        (["vm", "describe", "x", "--zone", "--json"], "the next word is the option --json"),
    ],
)  # fmt: skip
def test_an_option_mistake_says_what_to_write(argv: list[str], says: str, tmp_path: Path) -> None:
    r = tpuops(*argv, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == ExitCode.USAGE and len(lines) == 1 and says in lines[0], r.stderr


def test_an_option_value_that_only_looks_like_an_option_is_kept(tmp_path: Path) -> None:
    """`--set cmd=--version` is a value: only a word that is one of the command's options is refused."""
    r = tpuops("sop", "run", "exec", "--local", "--set", "cmd=echo -x", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_completion_installs_and_completes(tmp_path: Path) -> None:
    """Completion is keyed on the program's name: the `tpuops` console script people type."""
    script_bin = shutil.which("tpuops", path=str(Path(sys.executable).parent))
    assert script_bin, "the tpuops console script beside this interpreter (pip install -e .)"
    home = tmp_path / "home"
    home.mkdir()
    # Typed in bash, as people do: typer finds the shell among the command's parent processes (shellingham), not
    # in $SHELL, so a suite started with no shell above it (nohup, a service) still has one here.
    r = subprocess.run(
        ["bash", "-c", '"$0" --install-completion; exit $?', script_bin], capture_output=True, text=True, timeout=60,
        cwd=tmp_path,
        env={**os.environ, "HOME": str(home), "SHELL": "/bin/bash"}, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    script = home / ".bash_completions" / "tpuops.sh"
    assert "_TPUOPS_COMPLETE" in script.read_text() and str(script) in (home / ".bashrc").read_text()
    done = subprocess.run(
        [script_bin], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
        env={**os.environ, "_TPUOPS_COMPLETE": "complete_bash", "COMP_WORDS": "tpuops ru", "COMP_CWORD": "1"},
    )  # fmt: skip
    assert done.stdout.split() == ["run", "runs"], (done.stdout, done.stderr)


def _record(home: Path, run_id: str, workers: list[int], logs: dict[int, str]) -> None:
    d = home / "runs" / run_id
    d.mkdir(parents=True)
    record = {"run_id": run_id, "sop": "grpo", "target": {"local": True}, "workers": workers,
              "values": {}, "started": 1.7e9}  # fmt: skip
    (d / "run.json").write_text(json.dumps(record))
    for w, text in logs.items():
        (d / f"worker-{w}.log").write_text(text)
        (d / f"worker-{w}.exit").write_text("0\n")


def test_runs_table_never_cuts_a_run_id(tpuops_home: Path, tmp_path: Path) -> None:
    run_id = "20261126-162501-recompile-check-ab12"
    _record(tpuops_home, run_id, [0], {0: "step=0 dt=1.00s\n"})
    r = tpuops("runs", cwd=tmp_path, COLUMNS="60")
    assert r.returncode == 0 and run_id in r.stdout, r.stdout


def test_logs_go_to_stdout_unprefixed_for_one_worker(tpuops_home: Path, tmp_path: Path) -> None:
    log = "start: backend=cpu\n" + "".join(f"step={i} reward_mean=0.1 dt=0.5s\n" for i in range(7))
    _record(tpuops_home, "one", [0], {0: log})
    r = tpuops("logs", "one", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == log and r.stderr == ""
    counted = subprocess.run(
        f"{sys.executable} -m tpuops logs one | grep -c '^step='", shell=True, capture_output=True,
        text=True, cwd=tmp_path, check=False, timeout=60,
    )  # fmt: skip
    assert counted.stdout.strip() == "7"
    assert tpuops("logs", "one", "--prefix", cwd=tmp_path).stdout.splitlines()[0] == "[w0] start: backend=cpu"
    _record(tpuops_home, "two", [0, 1], {0: "a\n", 1: "b\n"})
    both = tpuops("logs", "two", "--worker", "all", cwd=tmp_path)
    assert both.stdout.splitlines() == ["[w0] a", "[w1] b"]
    missing = tpuops("logs", "nope", cwd=tmp_path)
    assert missing.returncode == ExitCode.USAGE and missing.stdout == "" and "no run 'nope'" in missing.stderr
