"""A user's own repository and command, end to end: `tpuops recompile-check -- CMD` and `tpuops run job -- CMD`
on a checkout shaped like a real user's (no pyproject: requirements.txt, scripts/train.py with its own
--config/--set, configs/*.yaml), locally here and on an emulated two-worker VM in
tests/tpuops/cloud/test_own_code_vm.py: exit 7 on a real jax.jit recompile, 0 when clean, 13 (never 0 or 7)
when no step line or no compile logging was seen. Every step-line style is covered by the scanner's unit
tests (tests/tpuops/logs/test_step_lines.py); here a few styles run for real."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuops.run.result import NO_COMPILE_LOG, NO_STEP_LINE

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "user_repo"
TRAIN = ["python", "-u", "scripts/train.py", "--config", "configs/small.yaml"]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


def tpuops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the exit code is what these tests check
        [sys.executable, "-m", "tpuops", *args],
        cwd=cwd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "COLUMNS": "200"},
    )  # fmt: skip


def result(r: subprocess.CompletedProcess[str], code: int) -> dict:
    assert r.returncode == code, f"exit {r.returncode}, wanted {code}:\n{r.stderr[-4000:]}"
    return json.loads(r.stdout)


@pytest.fixture
def user_repo(tmp_path: Path) -> Iterator[Path]:
    """The user's checkout, its `origin` a bare repository under /tmp every worker user can read, HEAD pushed."""
    work, bare = tmp_path / "my-project", Path("/tmp") / f"tpuops-user-{os.getpid()}-{tmp_path.name}.git"
    shutil.copytree(FIXTURE, work)
    subprocess.run([*GIT, "init", "-q", str(work)], check=True)
    subprocess.run([*GIT, "-C", str(work), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(work), "commit", "-qm", "my project"], check=True)
    subprocess.run([*GIT, "init", "-q", "--bare", str(bare)], check=True)
    subprocess.run([*GIT, "-C", str(work), "remote", "add", "origin", str(bare)], check=True)
    subprocess.run([*GIT, "-C", str(work), "push", "-q", "origin", "HEAD:main"], check=True)
    subprocess.run(
        [*GIT, "-C", str(work), "fetch", "-q", "origin"], check=True
    )  # origin/main: HEAD is pushed
    subprocess.run(["chmod", "-R", "a+rX", str(bare)], check=True)
    yield work
    subprocess.run(["rm", "-rf", str(bare)], check=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("style", "recompile_at", "extra", "code"),
    [
        ("root", 2, [], 7),  # INFO:root:step=N through Python's logging: the recompile at step 2 is caught
        ("slash", -1, [], 0),  # `Step N/M`, clean: ok
        ("none", 3, ["--set", r"step_pattern=^iteration (?P<step>\d+) done"], 7),  # the user's own pattern
    ],
)
def test_recompile_check_of_the_users_command_locally(
    user_repo: Path, style: str, recompile_at: int, extra: list[str], code: int
) -> None:
    cmd = [*TRAIN, "--set", f"style={style}", "--set", f"recompile_at={recompile_at}"]
    data = result(tpuops("recompile-check", "--local", "--json", *extra, "--", *cmd, cwd=user_repo), code)
    log = data["log"]
    assert data["sop"] == "recompile-check-job" and log["steps"] == 5 and log["compiles"]["warmup"] >= 1
    assert [c["step"] for c in log["recompiles"]] == ([recompile_at] * 2 if code == 7 else [])
    assert {c["function"] for c in log["recompiles"]} <= {"<lambda>", "broadcast_in_dim"}
    env = next(s for s in data["steps"] if s["kind"] == "python_env")
    assert env["workers"]["0"]["status"] in ("ok", "nothing", "changed")


@pytest.mark.slow
def test_a_recompile_check_that_saw_nothing_fails_closed(user_repo: Path) -> None:
    """No JAX here (the script can run without it): the check never sees a compile, nor, in one run, a step."""
    no_jax = [*TRAIN, "--set", "use_jax=false"]
    unseen = tpuops(
        "recompile-check", "--local", "--json", "--", *no_jax, "--set", "style=none", cwd=user_repo
    )
    data = result(unseen, 13)
    assert data["error_class"] == "unverified" and data["hint"] == NO_STEP_LINE
    again = tpuops("attach", data["run_id"], cwd=user_repo)  # a later look judges the run the same way
    assert again.returncode == 13 and "fix: no step line seen" in " ".join(again.stderr.split()), again.stderr
    quiet = tpuops("recompile-check", "--local", "--", *no_jax, "--set", "style=eq", cwd=user_repo)
    assert quiet.returncode == 13, quiet.stderr[-3000:]
    said = " ".join(quiet.stderr.split())  # people's output: the report, then the one line with the fix
    assert f"fix: {NO_COMPILE_LOG}" in said and "5 steps (0..4)" in said and "exit code 13" in said
    # The same command as a plain job judges no recompile: ok.
    # The same command as a plain job judges no recompile: ok. Its `step=N loss=L` lines print no duration:
    # the step time is the gap between step lines as the follower saw them (steps of ~0.8 s, polls of 0.5 s).
    slow = ["--set", "style=plain", "--set", "step_sleep=0.8"]
    plain = result(tpuops("run", "job", "--local", "--json", "--", *no_jax, *slow, cwd=user_repo), 0)
    log = plain["log"]
    assert log["steps"] == 5 and log["dt"] is not None and log["dt"]["n"] >= 2, log["rows"]
    assert 0.3 <= log["dt"]["p50"] <= 5.0 and all(r["dt"] is None or r["dt"] > 0 for r in log["rows"])
    seen = Path(os.environ["TPUOPS_HOME"]) / "runs" / plain["run_id"] / "worker-0.seen.json"
    assert sorted(json.loads(seen.read_text())) == ["0", "1", "2", "3", "4"]


@pytest.mark.slow
def test_bench_of_two_variants_of_the_users_command(user_repo: Path) -> None:
    """`bench rollout -- CMD`: each variant is the rest of a shell line (environment, extra arguments)."""
    cmd = [*TRAIN, "--set", "use_jax=false"]  # `step=N ... step_time=Ts` lines; no JAX needed to time them
    r = tpuops(
        "bench", "rollout", "--local", "--json", "--variant", "", "--variant", "DEMO=1 --set step_sleep=0.3",
        "--", *cmd, cwd=user_repo,
    )  # fmt: skip
    base, slow = result(r, 0)
    assert (base["label"], slow["label"]) == ("baseline", "DEMO=1 --set step_sleep=0.3")
    assert base["steps"] == slow["steps"] == 5 and base["dt_p50"] < 0.2 and 0.3 <= slow["dt_p50"] < 2.0
    runs = Path(os.environ["TPUOPS_HOME"]) / "runs"
    recorded = json.loads((runs / slow["run_id"] / "run.json").read_text())
    assert recorded["sop"] == "job" and recorded["values"]["env"] == ["DEMO=1"]
    assert recorded["values"]["cmd"] == [*cmd, "--set", "step_sleep=0.3"]
