"""`tpuops profile RUN_ID` on a running job of the user's own code (`run job --local`): a capture through the
server its one line starts, and the same command against a job whose profiler port is closed."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parent / "fixtures"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
EXTRA = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "COLUMNS": "200"}


def env() -> dict[str, str]:
    """The environment at call time: the test's own TPUOPS_HOME (set per test), never the user's runs."""
    return {**os.environ, **EXTRA}


def tpuops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the exit code is what these tests check
        [sys.executable, "-m", "tpuops", *args],
        cwd=cwd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, env=env(),
    )  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def user_repo(tmp_path: Path) -> Iterator[Path]:
    """The user's checkout with the profiled script, its `origin` a bare repository, HEAD pushed."""
    work, bare = tmp_path / "my-project", Path("/tmp") / f"tpuops-prof-{os.getpid()}-{tmp_path.name}.git"
    shutil.copytree(FIXTURE / "user_repo", work)
    shutil.copy(FIXTURE / "profile" / "own_job.py", work / "own_job.py")
    for cmd in (
        ["init", "-q", str(work)],
        ["-C", str(work), "add", "-A"],
        ["-C", str(work), "commit", "-qm", "my project"],
        ["init", "-q", "--bare", str(bare)],
        ["-C", str(work), "remote", "add", "origin", str(bare)],
        ["-C", str(work), "push", "-q", "origin", "HEAD:main"],
        ["-C", str(work), "fetch", "-q", "origin"],
    ):
        subprocess.run([*GIT, *cmd], check=True)
    yield work
    subprocess.run(["rm", "-rf", str(bare)], check=True)


def start_job(repo: Path, port: int, cmd: list[str], *more: str) -> str:
    """`tpuops run job --local [MORE] -- CMD`, followed until step 2, then left running (the follower killed)."""
    args = [sys.executable, "-m", "tpuops", "run", "job", "--local", "--set", f"profile_port={port}", *more]
    follower = subprocess.Popen(
        [*args, "--", *cmd],
        cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(),
    )  # fmt: skip
    assert follower.stderr is not None
    seen = []
    while "[w0] step=2 " not in (line := follower.stderr.readline()):
        seen.append(line)
        assert line or follower.poll() is None, "".join(seen[-30:])
    follower.kill()  # the laptop goes away; the job does not
    follower.wait()
    return str(status(repo)[0]["run_id"])  # newest first


def status(repo: Path) -> list[dict[str, str]]:
    return list(json.loads(tpuops("runs", "--json", cwd=repo).stdout))


@pytest.mark.slow
def test_profile_a_users_job_then_a_closed_port(user_repo: Path) -> None:
    run_id = start_job(user_repo, free_port(), ["python", "-u", "own_job.py", "400"])
    try:
        r = tpuops("profile", run_id, "--seconds", "2", "--json", cwd=user_repo)
        assert r.returncode == 0, r.stderr[-3000:]
        data = json.loads(r.stdout)
        w0 = data["workers"]["0"]
        assert w0["xplane_bytes"] > 1024 and len(w0["ops"]) >= 3
        assert all(0 < op["share"] <= 1 for op in w0["ops"]) and w0["device"] == "CPU"
        assert w0["steps"], "the job's StepTraceAnnotation steps are in the capture"
        folder = Path(w0["folder"])
        assert (folder / "trace.json.gz").stat().st_size > 1024
        assert list(folder.glob("plugins/profile/*/w0.xplane.pb"))
        assert any("ui.perfetto.dev" in line for line in data["open"])
        people = tpuops("profile", run_id, "--seconds", "1", cwd=user_repo)  # the terminal's summary
        assert people.returncode == 0 and "share" in people.stderr and "open: Perfetto" in people.stderr
    finally:
        tpuops("stop", run_id, cwd=user_repo)


@pytest.mark.slow
def test_a_job_without_a_server_is_left_running(user_repo: Path) -> None:
    """The run records a port, but nothing listens on it (the job never started a server): one line, exit 1."""
    closed = free_port()
    loop = "i=0; while [ $i -lt 600 ]; do echo step=$i loss=1; i=$((i+1)); sleep 0.1; done"
    run_id = start_job(user_repo, closed, ["sh", "-c", loop])
    try:
        r = tpuops("profile", run_id, "--seconds", "1", cwd=user_repo)
        assert r.returncode == 1
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and f"no profiler server on its port {closed}" in errors[0], r.stderr
        assert "jax.profiler.start_server(int(os.environ['TPUOPS_PROFILE_PORT']))" in errors[0]
        (after,) = [r for r in status(user_repo) if r["run_id"] == run_id]
        assert after["status"] == "running", after  # the job untouched
    finally:
        tpuops("stop", run_id, cwd=user_repo)


@pytest.mark.slow
def test_profile_steps_of_a_users_job_reach_the_end_report_and_the_page(
    user_repo: Path, tmp_path: Path
) -> None:
    """`run job --profile-steps 2-3`: the program traces those steps where TPUOPS_PROFILE_DIR says; the end report
    lists their top ops, result.json keeps them, and `tpuops report RUN_ID --html` shows them in Chromium."""
    from tests.tpuops.run.test_logreport import CHROMIUM_FLAGS, chromium

    exe = chromium()
    r = tpuops("run", "job", "--local", "--profile-steps", "2-3", "--", "python", "-u", "own_job.py", "6",
               cwd=user_repo)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "profile of steps 2-3, w0" in r.stderr and "open: Perfetto" in r.stderr, r.stderr[-3000:]
    run_id = str(status(user_repo)[0]["run_id"])
    run = Path(os.environ["TPUOPS_HOME"]) / "runs" / run_id
    w0 = json.loads((run / "result.json").read_text())["profile"]["workers"]["0"]
    assert w0["steps"] == [2, 3] and len(w0["ops"]) >= 3 and w0["xplane_bytes"] > 1024
    assert all(0 < op["share"] <= 1 for op in w0["ops"])
    table = r.stderr[r.stderr.index("profile of steps 2-3") :].splitlines()
    assert any(op["name"] in line and "%" in line for op in w0["ops"][:3] for line in table)
    assert (run / "profile" / "steps" / "w0" / "trace.json.gz").stat().st_size > 1024
    page = tmp_path / "page.html"
    assert tpuops("report", run_id, "--html", str(page), cwd=user_repo).returncode == 0
    dom = subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=90, check=True,
    ).stdout  # fmt: skip
    section = dom[dom.index('<section id="profile">') :]
    section = section[: section.index("</section>")]
    assert "Profile: steps 2-3" in section and 'class="profile-ops"' in section
    rows = section[section.index('class="profile-ops"') :].count("<tr>") - 1
    assert rows >= 3 and w0["ops"][0]["name"] in section


def test_profile_steps_is_checked_before_anything_runs(tmp_path: Path) -> None:
    """A range that is not A-B, or a SOP that traces no steps: exit 2, one line, nothing started."""
    r = tpuops("run", "job", "--local", "--dry-run", "--offline", "--profile-steps", "7-5", "--", "true",
               cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2 and "--profile-steps: steps must be A-B with 0 <= A <= B" in r.stderr, r.stderr
    r = tpuops("run", "smoke", "--local", "--dry-run", "--offline", "--profile-steps", "1-2", cwd=tmp_path)
    assert r.returncode == 2 and "SOP smoke does not trace steps" in r.stderr, r.stderr


@pytest.mark.slow
def test_attach_brings_the_traced_steps_of_a_detached_job(user_repo: Path, tmp_path: Path) -> None:
    """The run's own follower gone before the traced steps: `tpuops attach` fetches their trace at the end, so
    the report page has it."""
    run_id = start_job(
        user_repo, free_port(), ["python", "-u", "own_job.py", "30"], "--profile-steps", "20-21"
    )
    r = tpuops("attach", run_id, cwd=user_repo)
    assert r.returncode == 0, r.stderr[-3000:]
    run = Path(os.environ["TPUOPS_HOME"]) / "runs" / run_id
    assert (run / "profile" / "steps" / "w0" / "trace.json.gz").stat().st_size > 1024
    page = tmp_path / "page.html"
    assert tpuops("report", run_id, "--html", str(page), cwd=user_repo).returncode == 0
    text = page.read_text()
    ops = text[text.index('class="profile-ops"') :]
    assert "Profile: steps 20-21" in text and ops[: ops.index("</table>")].count("<tr><td>") >= 3
