"""Fault injection over real sshd workers: dropped sessions, slow links, black holes, unreachable workers,
a stale run holder whose children outlive it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.tpuops.conftest import SshdPool
from tests.tpuops.netfaults import DelayProxy
from tpuops.config import TargetSpec
from tpuops.errors import ConnectError, ExitCode
from tpuops.run import launch
from tpuops.run.launch import RunRequest
from tpuops.sop.executor import Executor
from tpuops.sop.loader import Sop
from tpuops.transport.base import Kind, Worker
from tpuops.transport.ssh import SshTransport


def group_members(pgid: int) -> list[int]:
    """Non-zombie processes of a process group, read from this machine's /proc (the workers are local users)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
        except (OSError, IndexError):
            continue  # it ended while we looked
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(stat.parent.name))
    return found


def _until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Wait for a real condition, checked every 10 ms, failing the test (naming it) at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g}s: {what}")
        time.sleep(0.01)


def test_sshd_killed_mid_run_loses_and_repeats_no_line(sshd_pool: SshdPool) -> None:
    (w,) = sshd_pool.take(1)
    cmd = "i=0; while [ $i -lt 30 ]; do echo step=$i dt=0.05s; i=$((i+1)); sleep 0.05; done"
    sop = Sop.model_validate(
        {"name": "job", "steps": [
            {"kind": "run", "command": cmd, "runs_dir": "~/runs"},
            {"kind": "follow", "runs_dir": "~/runs", "poll_s": 0.05, "timeout": 60},
        ]}
    )  # fmt: skip
    seen: list[str] = []
    t = sshd_pool.transport([w])
    result: dict[str, object] = {}
    thread = threading.Thread(
        target=lambda: result.update(
            r=Executor(t, on_line=lambda _, s: seen.append(s)).execute(sop, {}, "cut", [0])
        )
    )
    thread.start()
    _until(lambda: len(seen) >= 5, "5 lines followed")
    w.drop_connections()  # every SSH session of the worker dies (the detached job does not)
    cut_at = len(seen)
    log = w.home / "runs" / "cut" / "worker-0.log"
    # The job goes on writing while the follower is cut off: lines it must later show, once and in order.
    _until(lambda: log.read_text().count("\n") >= cut_at + 3, "3 more lines written during the cut")
    w.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the follow did not end within 60 s of the job's end"
    report = result["r"]
    assert report.ok, report.first_failure()
    assert seen == [f"step={i} dt=0.05s" for i in range(30)]


def test_slow_link_still_completes_and_timeouts_fire_when_they_should(sshd_pool: SshdPool) -> None:
    (w,) = sshd_pool.take(1)
    slow = DelayProxy(w.port, delay_s=0.05)
    hole = DelayProxy(w.port, blackhole=True)
    try:
        t = SshTransport(
            [Worker(0, "127.0.0.1", slow.port, w.user, w.fingerprint)],
            known_hosts=Path("/nonexistent"),
            identity=sshd_pool.key,
        )
        r = t.run(0, "echo hello", timeout=20)
        assert r.ok and r.stdout == "hello\n"
        t0 = time.monotonic()
        late = t.run(0, "sleep 5; echo late", timeout=1.0)
        assert late.timed_out and "late" not in late.stdout
        assert time.monotonic() - t0 < 3
        t.close()
        dead = SshTransport(
            [Worker(0, "127.0.0.1", hole.port, w.user, w.fingerprint)],
            known_hosts=Path("/nonexistent"),
            identity=sshd_pool.key,
            connect_timeout=0.5,
            connect_retries=2,
        )
        t0 = time.monotonic()
        with pytest.raises(ConnectError, match=r"cannot connect to w0 .* after 2 tries"):
            dead.connect(0)
        assert time.monotonic() - t0 < 5
    finally:
        slow.close()
        hole.close()


def test_32_workers_one_unreachable_fail_fast_names_it_keep_going_finishes(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    workers = sshd_pool.take(32)
    workers[17].stop()
    spec = TargetSpec(
        hosts=tuple(f"{w.user}@127.0.0.1:{w.port}" for w in workers),
        hostkey=tuple(w.fingerprint for w in workers),
        identity=str(sshd_pool.key),
        connect_timeout=2.0,
    )
    req = RunRequest(sop="exec", sets={"cmd": "touch ~/done"}, target=spec)
    with pytest.raises(ConnectError, match=r"cannot connect to w17 "):
        launch.start(req, cwd=tmp_path)
    assert not (workers[0].home / "done").exists()  # nothing ran anywhere
    kept = launch.start(
        RunRequest(sop="exec", sets={"cmd": "touch ~/done"}, target=spec, keep_going=True), cwd=tmp_path
    )
    assert kept.steps[0].title == "connect" and kept.steps[0].outcomes[17].status == "failed"
    assert sum((w.home / "done").exists() for w in workers) == 31
    assert kept.code == ExitCode.CONNECT
    assert kept.to_dict()["error_class"] == "connect"
    workers[17].start()


def test_force_stops_a_stale_holder_and_every_process_of_its_group(sshd_pool: SshdPool) -> None:
    # The workers' login shell is /bin/sh, dash on Debian (no `kill -- -PGID`). The holder's group: its
    # shell, a foreground sleep, and a background subshell that ignores SIGTERM (as a multi-host trainer
    # does once jax.distributed is up), so stopping it takes the group SIGTERM, waiting on the group (not
    # the leader), then the group SIGKILL.
    (w,) = sshd_pool.take(1)
    holder = "(trap '' TERM; sleep 600) & sleep 600"
    sop = Sop.model_validate(
        {"name": "job", "steps": [{"kind": "run", "command": holder, "runs_dir": "~/runs"}]}
    )
    t = sshd_pool.transport([w])
    first = Executor(t).execute(sop, {}, "run-one", [0])
    assert first.ok, first.first_failure()
    pid = first.steps[0].outcomes[0].data["pid"]
    deadline = time.monotonic() + 10
    while len(group_members(pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(pid)) >= 3  # the shell, the subshell's sleep, the foreground sleep
    forced = Executor(t, force=True).execute(sop, {}, "run-two", [0])
    assert forced.ok, forced.first_failure()
    assert forced.steps[0].outcomes[0].status == "changed"
    assert group_members(pid) == []  # nothing of the holder's group is left, the TERM-deaf child included
    assert (w.home / "runs/run-one/worker-0.exit").read_text().split() == ["143", "stopped"]
    new = next(s for s in forced.steps if s.kind == "run").outcomes[0].data["pid"]
    t.run(0, f'kill -KILL "-{new}"')
    t.close()


def test_a_command_killed_on_the_worker_is_said_as_such_not_as_a_lost_connection(sshd_pool: SshdPool) -> None:
    """The remote shell dies of SIGKILL: sshd sends no exit status (OpenSSH's exit-signal), the connection stays
    up. The result says the command was killed (exit 255, as ssh's own), and the next command runs on the same
    connection; a command that exits by itself still gives its own code."""
    (w,) = sshd_pool.take(1)
    t = sshd_pool.transport([w])
    try:
        killed = t.run(0, "echo before; kill -KILL $$")
        assert (killed.kind, killed.exit_code, killed.stdout) == (Kind.EXIT, 255, "before\n"), killed
        assert killed.error == "the command was killed on the worker (no exit status)"
        after = t.run(0, "exit 7")
        assert (after.kind, after.exit_code, after.error) == (Kind.EXIT, 7, None), after
    finally:
        t.close()


def test_a_connection_cut_during_a_command_is_a_lost_connection_not_a_killed_command(
    sshd_pool: SshdPool,
) -> None:
    """The network between tpuops and a worker is cut while a command runs: the channel closes without an exit
    status as a killed shell's does, but the connection is gone, and the result says so."""
    (w,) = sshd_pool.take(1)
    link = DelayProxy(w.port)
    t = SshTransport(
        [Worker(0, "127.0.0.1", link.port, w.user, w.fingerprint)],
        known_hosts=Path("/nonexistent"),
        identity=sshd_pool.key,
    )
    try:
        assert t.run(0, "true").ok  # connected
        threading.Timer(0.5, link.cut).start()
        cut = t.run(0, "sleep 30")
        assert (cut.kind, cut.exit_code) == (Kind.CONNECT, 255), cut
        assert cut.error is not None and cut.error.startswith("connection lost"), cut
    finally:
        t.close()
        link.close()
