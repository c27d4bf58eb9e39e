"""Test runs on one machine stay apart: sshd worker users unique per process, leased, deleted at the end."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tpuops.cloud.emulator.sshd import client_keypair, remove_users, start_worker
from tpuops.cloud.emulator.users import UserLeases

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-worker Unix users exist only when run as root")

PREFIX_OF_A_NEW_PROCESS = (
    "from tpuops.cloud.emulator.sshd import user_prefix; import os; print(user_prefix(), os.getpid())"
)


def _fresh_prefix() -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "TPUOPS_SSHD_USER_PREFIX"}
    out = subprocess.run(
        [sys.executable, "-c", PREFIX_OF_A_NEW_PROCESS], env=env, capture_output=True, text=True, check=True
    )
    prefix, pid = out.stdout.split()
    return prefix, int(pid)


def test_each_process_gets_its_own_worker_user_names() -> None:
    (a, pid_a), (b, pid_b) = _fresh_prefix(), _fresh_prefix()
    assert a != b and a.startswith(f"tpuops-{pid_a}-") and b.startswith(f"tpuops-{pid_b}-")
    assert len(f"{a}w99") <= 32  # useradd's limit


def test_a_worker_user_another_live_run_holds_is_refused_not_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"tpt{os.getpid()}x-"
    monkeypatch.setenv("TPUOPS_SSHD_USER_PREFIX", prefix)
    holder = subprocess.Popen(  # another run holding the lease of {prefix}w0
        [sys.executable, "-c", f"from tpuops.cloud.emulator.users import UserLeases; import sys, time; "
         f"assert UserLeases('').hold('{prefix}w0'); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        _, public = client_keypair(tmp_path / "client")
        with pytest.raises(RuntimeError, match=rf"{prefix}w0 is in use by another live run"):
            start_worker(0, tmp_path / "w0", public)
        with pytest.raises(KeyError):
            pwd.getpwnam(f"{prefix}w0")  # nothing was made for it
    finally:
        holder.kill()
        holder.wait()
        UserLeases("").lock_dir.joinpath(f"{prefix}w0.lock").unlink(missing_ok=True)  # the killed holder's


def _wait_until_running_as(pid: int, uid: int, timeout: float = 10.0) -> None:
    """Until process `pid` runs with real uid `uid` (its /proc status), or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        if int(next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1]) == uid:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not become uid {uid} within {timeout} s")


def test_the_users_and_homes_a_session_made_are_deleted_with_their_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPUOPS_SSHD_USER_PREFIX", f"tpt{os.getpid()}y-")
    base = tmp_path / "sshd"
    base.mkdir(mode=0o755)
    _, public = client_keypair(base / "client")
    w = start_worker(0, base / "w0", public)
    assert w.created_user and w.running and w.home.is_dir()
    uid = pwd.getpwnam(w.user).pw_uid
    job = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "60"])
    try:
        _wait_until_running_as(job.pid, uid)  # else remove_users may look before setpriv has become the user
        remove_users([w])
        assert job.wait(timeout=10) == -9  # the user's own leftover process (this session's) was stopped
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    with pytest.raises(KeyError):
        pwd.getpwnam(w.user)
    assert not w.home.exists() and not w.running
    assert not (UserLeases("").lock_dir / f"{w.user}.lock").exists()  # the lease's file went with it


def test_the_os_login_users_an_emulator_made_are_deleted_when_it_stops(tmp_path: Path) -> None:
    from tpuops.cloud.emulator.model import Model

    _, public = client_keypair(tmp_path / "client")
    model = Model(tmp_path / "state", ["us-east1-d"], user_prefix=f"tpt{os.getpid()}y-")
    profile = model.import_ssh_key("someone@example.com", {"key": public}, "p")["loginProfile"]
    user = profile["posixAccounts"][0]["username"]
    assert pwd.getpwnam(user).pw_dir == f"/home/{user}"  # a real POSIX user to log in as
    model.stop_all()
    with pytest.raises(KeyError):
        pwd.getpwnam(user)
    assert not Path(f"/home/{user}").exists()


def test_a_second_deletion_of_a_vm_never_reaches_the_next_vm_that_got_its_user(tmp_path: Path) -> None:
    """A VM deleted twice (a delete racing a test's clean-up): the second deletion finds its users already given
    back, and one of them now the worker user of a new VM of the same name. That VM's processes live on, and the
    record of it stays."""
    from tpuops.cloud.emulator.model import Model

    _, public = client_keypair(tmp_path / "client")
    model = Model(tmp_path / "state", ["us-east1-d"], user_prefix=f"tpt{os.getpid()}z-")
    parent = "projects/p/locations/us-east1-d"

    def create() -> Any:
        model.create_node(
            parent, "twice", {"acceleratorType": "v4-8", "metadata": {"ssh-keys": f"u:{public}"}}
        )
        for t in list(model._threads):
            t.join(timeout=60)
        return model.node(f"{parent}/nodes/twice")

    job = None
    try:
        first = create()
        model._teardown(first, None)
        second = create()
        assert second.workers[0].user == first.workers[0].user  # the user went back and was taken again
        uid = pwd.getpwnam(second.workers[0].user).pw_uid
        job = subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "60"]
        )
        _wait_until_running_as(job.pid, uid)
        model._teardown(first, None)  # the racing second deletion
        time.sleep(0.2)
        assert job.poll() is None  # the new VM's process lives
        assert model.node(f"{parent}/nodes/twice") is second and second.workers[0].running
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            job.wait()
        model.stop_all()
