"""The executor over real sshd workers: fan-out, idempotent git_sync, the TPU lock, detached runs, hostile values."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tpuops.conftest import SshdPool, commit_to
from tpuops.config import TargetSpec
from tpuops.errors import ExitCode, HostKeyError
from tpuops.run import launch
from tpuops.run.launch import RunRequest


def spec_for(pool: SshdPool, workers: list) -> TargetSpec:
    return TargetSpec(
        hosts=tuple(f"{w.user}@127.0.0.1:{w.port}" for w in workers),
        hostkey=tuple(w.fingerprint for w in workers),
        identity=str(pool.key),
    )


def run(pool: SshdPool, workers: list, sop: str, cwd: Path, **kw: object) -> launch.RunResult:
    sets = {k: str(v) for k, v in kw.pop("sets", {}).items()}  # type: ignore[union-attr]
    req = RunRequest(sop=sop, sets=sets, target=spec_for(pool, workers), **kw)  # type: ignore[arg-type]
    result = launch.start(req, cwd=cwd)
    assert isinstance(result, launch.RunResult)
    return result


def test_smoke_sop_fans_out_to_8_workers(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    workers = sshd_pool.take(8)
    bare, sha = git_remote
    lines: list[tuple[int, str]] = []
    req = RunRequest(
        sop="smoke",
        sets={"repo_url": str(bare), "steps": "3", "step_seconds": "0.05", "lockfile": "~/libtpu_lockfile"},
        target=spec_for(sshd_pool, workers),
    )
    report = launch.start(req, cwd=tmp_path, on_line=lambda w, line: lines.append((w, line)))
    assert isinstance(report, launch.RunResult)
    assert report.ok, report.first_failure()
    git = report.steps[0]
    assert {o.data["sha"] for o in git.outcomes.values()} == {sha[:7]}
    assert set(git.outcomes) == set(range(8))
    # Every worker ran the job under its own user and streamed 3 step lines, prefixed by worker.
    for w in range(8):
        steps = [line for k, line in lines if k == w and line.startswith("step=")]
        assert len(steps) == 3
    local_logs = sorted((Path(launch.user_config.state_home()) / "runs" / report.run_id).glob("worker-*.log"))
    assert len(local_logs) == 8
    assert "step=2" in local_logs[7].read_text()
    assert report.code == ExitCode.OK


def test_git_sync_twice_is_idempotent_and_keeps_logs_and_env(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    workers = sshd_pool.take(2)
    bare, _ = git_remote
    (tmp_path / ".env").write_text("WANDB_API_KEY=sentinel-secret-123\n")
    sets = {"repo_url": str(bare), "lockfile": "~/libtpu_lockfile", "repo_dir": "~/repo"}
    first = run(sshd_pool, workers, "sync", tmp_path, sets=sets)
    assert [o.status for o in first.steps[0].outcomes.values()] == ["changed", "changed"]
    assert [o.status for o in first.steps[2].outcomes.values()] == ["changed", "changed"]
    # Logs and an untracked scratch file inside the checkout; the log dir and .env must survive a sync.
    for w in workers:
        (w.home / "repo" / "runs").mkdir()
        (w.home / "repo" / "runs" / "keep.log").write_text("precious")
    second = run(sshd_pool, workers, "sync", tmp_path, sets=sets)
    assert [o.status for o in second.steps[0].outcomes.values()] == ["nothing", "nothing"]
    assert [o.status for o in second.steps[2].outcomes.values()] == ["nothing", "nothing"]
    for w in workers:
        assert (w.home / "repo" / "runs" / "keep.log").read_text() == "precious"
        env = w.home / "repo" / ".env"
        assert env.stat().st_mode & 0o777 == 0o600
        assert "sentinel-secret-123" in env.read_text()
    # A worker whose git abbreviates to 12 (core.abbrev, or a big repository's auto length) still says 7 hex digits,
    # so its sha compares equal to every other worker's and to the log's.
    config = workers[0].home / "repo" / ".git" / "config"
    subprocess.run(["git", "config", "--file", str(config), "core.abbrev", "12"], check=True)
    # A new commit on the remote: the next sync moves every worker to it.
    new = commit_to(bare, tmp_path, "more.py", "x = 1\n")
    third = run(sshd_pool, workers, "sync", tmp_path, sets=sets)
    assert {o.data["sha"] for o in third.steps[0].outcomes.values()} == {new[:7]}
    assert all(o.status == "changed" for o in third.steps[0].outcomes.values())


def test_git_sync_to_a_commit(sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path) -> None:
    workers = sshd_pool.take(1)
    bare, first = git_remote
    commit_to(bare, tmp_path, "b.py", "b = 2\n")
    report = run(
        sshd_pool, workers, "sync", tmp_path, sets={"repo_url": str(bare), "branch": first, "lockfile": "~/l"}
    )
    assert report.steps[0].outcomes[0].data["sha"] == first[:7]


def _start(transport: object, script: str, fd: str = "") -> int:
    """A detached stand-in process on worker 0 (optionally holding a file open as fd 9); its pid."""
    line = f"setsid nohup sh -c {shlex.quote(script)} {fd} > /dev/null 2>&1 < /dev/null & echo $!"
    return int(transport.run(0, line).stdout.strip())  # type: ignore[attr-defined]


def test_clear_lockfile_refuses_while_a_holder_runs_then_force_kills_in_order(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    """Holders by device, not by name: a process with a (fake) TPU device open and one with the lock open are
    holders; a same-user process whose command line looks like the trainer is not, and --force spares it."""
    (w,) = sshd_pool.take(1)
    lock = w.home / "libtpu_lockfile"
    dev = w.home / "fakedev"
    transport = sshd_pool.transport([w])
    transport.run(0, f"mkdir -p {dev} && touch {dev}/accel0 ~/libtpu_lockfile")
    # A stand-in for libtpu: it holds a TPU device open; on SIGTERM it records whether the lock still existed.
    trap = 'trap "[ -e ~/libtpu_lockfile ] && echo lock-present > ~/term.txt; exit 0" TERM; '
    device_holder = _start(transport, trap + "while :; do sleep 0.05; done", f"9<{dev}/accel0")
    lock_holder = _start(transport, "while :; do sleep 0.05; done", "9<~/libtpu_lockfile")
    # Another job of the same user that only looks like a trainer (the old name match took it for a holder).
    lookalike = _start(transport, "while :; do sleep 0.05; done; : python3 -m trainer.main")
    sets = {"lockfile": "~/libtpu_lockfile", "devices": f"{dev}/accel* {dev}/vfio/*"}
    try:
        busy = run(sshd_pool, [w], "lockfile", tmp_path, sets=sets)
        outcome = busy.steps[0].outcomes[0]
        assert outcome.status == "busy"
        assert f"pid={device_holder} why=device" in outcome.detail
        assert f"pid={lock_holder} why=lockfile" in outcome.detail
        assert f"pid={lookalike} " not in outcome.detail
        assert busy.code == ExitCode.TPU_BUSY
        assert lock.exists()
        forced = run(sshd_pool, [w], "lockfile", tmp_path, sets=sets, force=True)
        assert forced.steps[0].outcomes[0].status == "changed"
        killed = forced.steps[0].outcomes[0].data["killed"]
        assert str(device_holder) in killed and str(lock_holder) in killed  # (their sleep children too)
        assert str(lookalike) not in killed
        assert transport.run(0, f"kill -0 {lookalike} && echo alive").stdout.strip() == "alive"
        assert not lock.exists()
        # The holder saw SIGTERM while the lock still existed: kill and wait came before the removal.
        assert (w.home / "term.txt").read_text().strip() == "lock-present"
        again = run(sshd_pool, [w], "lockfile", tmp_path, sets=sets)
        assert again.steps[0].outcomes[0].status == "nothing"
    finally:
        transport.run(0, f"kill {lookalike} {device_holder} {lock_holder} 2>/dev/null; true")
        transport.close()


def test_without_tpu_device_files_nothing_is_a_holder(sshd_pool: SshdPool, tmp_path: Path) -> None:
    """A CPU box: no device file exists, so even a process with the lock open is left alone (a stale lock
    is removed, nothing is signalled)."""
    (w,) = sshd_pool.take(1)
    transport = sshd_pool.transport([w])
    transport.run(0, "touch ~/libtpu_lockfile")
    pid = _start(transport, "while :; do sleep 0.05; done; : python3 -m trainer.main", "9<~/libtpu_lockfile")
    sets = {"lockfile": "~/libtpu_lockfile", "devices": f"{w.home}/no-such-dev/accel*"}
    try:
        report = run(sshd_pool, [w], "lockfile", tmp_path, sets=sets, force=True)
        outcome = report.steps[0].outcomes[0]
        assert (outcome.status, outcome.detail) == ("changed", "lockfile removed")
        assert report.code == ExitCode.OK
        assert transport.run(0, f"kill -0 {pid} && echo alive").stdout.strip() == "alive"
    finally:
        transport.run(0, f"kill {pid} 2>/dev/null; true")
        transport.close()


def test_detached_run_survives_closing_the_connection(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    from tpuops.sop import loader
    from tpuops.sop.executor import Executor

    workers = sshd_pool.take(2)
    sop = loader.load(loader.find("smoke"))
    values = sop.resolve(
        {"repo_url": str(git_remote[0]), "steps": "8", "step_seconds": "0.1", "lockfile": "~/l"}
    )
    start = sop.model_copy(update={"steps": sop.steps[:4]})  # sync .. start job, no follow
    transport = sshd_pool.transport(workers)
    first = Executor(transport).execute(start, values, "run-detach", [0, 1])
    assert first.ok, first.first_failure()
    transport.close()  # the laptop goes away
    for w in workers:  # and every SSH session of the worker is dropped too
        w.drop_connections()
        w.start()
    follow = sop.model_copy(update={"steps": sop.steps[4:]})
    seen: list[tuple[int, str]] = []
    again = sshd_pool.transport(workers)
    report = Executor(again, on_line=lambda w, line: seen.append((w, line))).execute(
        follow, values, "run-detach", [0, 1]
    )
    assert report.ok, report.first_failure()
    assert report.steps[0].outcomes[0].data["exit_code"] == 0
    assert sum(1 for w, line in seen if w == 1 and line.startswith("step=")) == 8
    assert (workers[0].home / "tpuops/runs/run-detach/worker-0.exit").read_text().strip() == "0"


def test_hostile_set_value_is_inert(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    (w,) = sshd_pool.take(1)
    marker = w.home / "pwned"
    hostile = f"x; touch {marker}; echo $(touch {marker})"
    report = run(
        sshd_pool,
        [w],
        "sync",
        tmp_path,
        sets={"repo_url": str(git_remote[0]), "branch": hostile, "lockfile": "~/l"},
    )
    assert report.steps[0].outcomes[0].status == "failed"
    assert "unknown branch or commit" in report.steps[0].outcomes[0].detail
    assert report.code == ExitCode.USAGE
    echo = run(sshd_pool, [w], "exec", tmp_path, sets={"cmd": "echo", "repo_dir": f"~/d; touch {marker}"})
    assert echo.ok
    assert not marker.exists()
    assert (
        w.home / f"d; touch {marker}"
    ).is_dir()  # the value became a (strange) directory name, nothing ran


def test_host_key_mismatch_is_refused_before_any_step(sshd_pool: SshdPool, tmp_path: Path) -> None:
    a, b = sshd_pool.take(2)
    spec = TargetSpec(
        hosts=(f"{a.user}@127.0.0.1:{a.port}",), hostkey=(b.fingerprint,), identity=str(sshd_pool.key)
    )
    with pytest.raises(HostKeyError) as e:
        launch.start(RunRequest(sop="exec", sets={"cmd": "touch ~/ran"}, target=spec), cwd=tmp_path)
    assert a.fingerprint in e.value.line() and b.fingerprint in e.value.line()
    assert not (a.home / "ran").exists()


def test_fail_fast_names_the_worker_and_keep_going_finishes_the_rest(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    workers = sshd_pool.take(3)
    (workers[1].home / "fail").write_text("")
    cmd = "if [ -e ~/fail ]; then echo boom >&2; exit 3; fi; sleep 0.5; touch ~/done"
    fast = run(sshd_pool, workers, "exec", tmp_path, sets={"cmd": cmd})
    _, worker, outcome = fast.first_failure()
    assert worker == 1 and outcome.detail == "boom"
    assert {fast.steps[0].outcomes[w].status for w in (0, 2)} == {"cancelled"}
    assert not (workers[0].home / "done").exists()
    kept = run(sshd_pool, workers, "exec", tmp_path, sets={"cmd": cmd}, keep_going=True)
    assert kept.steps[0].outcomes[1].status == "failed"
    assert (workers[0].home / "done").exists() and (workers[2].home / "done").exists()
    assert kept.code == ExitCode.FAILED


def test_secret_env_values_never_reach_ps_or_outputs(sshd_pool: SshdPool, tmp_path: Path) -> None:
    (w,) = sshd_pool.take(1)
    transport = sshd_pool.transport([w])
    secret = "sentinel-value-9f8e7d"
    r = transport.run(0, 'ps -eo args | grep -c "$TOKEN" ; echo "$TOKEN" | wc -c', env={"TOKEN": secret})
    # Only the grep's own pattern could match, and it holds "$TOKEN" unexpanded in ps: no process shows the value.
    count, length = r.stdout.split()
    assert int(length) == len(secret) + 1
    assert (
        secret not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    )
    assert int(count) <= 1


def test_an_unknown_branch_is_bad_input_naming_the_branches_and_tags_found(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    (w,) = sshd_pool.take(1)
    bare, first = git_remote
    subprocess.run(["git", "-C", str(bare), "tag", "v1.0", first], check=True)
    subprocess.run(["git", "-C", str(bare), "branch", "dev", first], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(bare)], check=True)
    r = subprocess.run(  # noqa: PLW1510 - the exit code is what this test checks
        [sys.executable, "-m", "tpuops", "sop", "run", "sync", *sshd_pool.host_args([w]),
         "--set", f"repo_url={bare}", "--set", "branch=mian", "--set", "lockfile=~/l", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == ExitCode.USAGE, r.stderr
    data = json.loads(r.stdout)
    assert data["error_class"] == "usage"
    assert data["failure"]["detail"] == (
        "unknown branch or commit: mian (branches and tags found: dev, main, v1.0) (pass --set branch=NAME)"
    )
