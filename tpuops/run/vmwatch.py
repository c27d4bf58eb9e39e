"""A VM watched while a run (or an attach) follows it: lost when its API says so (a lost state, a MIG repairing,
an instance recreated) or when no worker answers on SSH for `unreachable_s` while the API still says otherwise."""

from __future__ import annotations

import contextlib
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from tpuops import config as user_config
from tpuops.errors import PermissionDeniedError, TpuopsError
from tpuops.run.store import RunRecord
from tpuops.run.target import Target

if TYPE_CHECKING:  # the cloud modules load only on a VM target
    from tpuops.cloud.client import Api
    from tpuops.cloud.tpu_api import VmInfo


class Lost:
    """Set by the watcher when the VM is gone, with the reason in words."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.why = ""
        self.error: TpuopsError | None = None  # the watch itself failed for good (a permission error)

    def set(self, why: str) -> None:
        self.why = why
        self.event.set()


def _reachable(endpoints: list[tuple[str, int]], timeout: float) -> bool:
    """Does any worker accept a TCP connection on its SSH port? (No login: cheap, and says the host is up.)"""
    for host, port in endpoints:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except OSError:
            continue
    return False


def lost_reason(before: VmInfo, now: VmInfo) -> str | None:
    """Why the VM `before` (as the run resolved it) is lost, seen as `now`; None while it is not (its backend
    says: a lost state, a MIG repairing, an instance recreated)."""
    from tpuops.cloud.vm_state import lost_reason as why

    return why(before, now)


def watch(
    api: Api,
    vm: VmInfo,
    endpoints: list[tuple[str, int]],
    every: float,
    unreachable_s: float,
    abort: threading.Event,
    lost: Lost,
) -> None:
    from tpuops.cloud.vm_state import refresh

    since: float | None = None  # when every worker was first seen unreachable, in a row
    while not abort.wait(every):
        try:
            now = refresh(api, vm)
            state, why = now.state, lost_reason(vm, now)
        except PermissionDeniedError as e:  # polling again will not grant the role: end the run
            lost.error = PermissionDeniedError(f"watching {vm.name}: {e.message}", hint=e.hint)
            abort.set()
            return
        except Exception:  # a watcher must outlive a flaky API (the client has retried): reachability counts
            state, why = None, None
        if why:
            lost.set(why)
            abort.set()
            return
        if not endpoints or _reachable(endpoints, timeout=min(5.0, max(every, 1.0))):
            since = None
            continue
        since = since if since is not None else time.monotonic()
        if time.monotonic() - since >= unreachable_s:
            lost.set(f"was unreachable (no worker answered on SSH for {unreachable_s:g}s; API state {state})")
            abort.set()
            return


@contextlib.contextmanager
def vm_watch(
    target: Target, *, watch_s: float, unreachable_s: float, on_lost: Callable[[], None]
) -> Iterator[Lost]:
    """The VM of `target` watched as a run watches it (`watched`: a lost state, or no worker answering on SSH for
    `unreachable_s`) while the block runs; `on_lost` is called once when it is lost (attach stops following)."""
    assert target.reach is not None and target.api is not None, "only a VM target is watched"
    abort, lost = threading.Event(), Lost()
    api, vm, endpoints = target.api.for_purpose("watch"), target.reach.vm, target.reach.watch_endpoints()

    def run() -> None:
        watch(api, vm, endpoints, watch_s, unreachable_s, abort, lost)
        if lost.event.is_set():
            on_lost()

    watcher = threading.Thread(target=run, daemon=True)
    watcher.start()
    try:
        yield lost
    finally:
        abort.set()
        watcher.join(timeout=watch_s + 5)


@contextlib.contextmanager
def watched_as_run(rec: RunRecord, target: Target, abort: threading.Event) -> Iterator[Lost | None]:
    """A VM run's VM watched while attached to it, as the run watched it (its recorded `unreachable_s` and poll
    interval); `abort` set when it is lost, so the follow ends at once. Nothing to watch elsewhere (None)."""
    if target.reach is None or target.api is None:
        yield None
        return
    recorded = rec.watch or {}
    with vm_watch(
        target, watch_s=float(recorded.get("watch_s", 10.0)),
        unreachable_s=float(recorded.get("unreachable_s", user_config.load().unreachable_s)), on_lost=abort.set,
    ) as lost:  # fmt: skip
        yield lost


def recovery_hint(rec: RunRecord, vm: VmInfo) -> str:
    """What to do about a VM lost under a run: one started with --recover, whose client (the one that would have
    recreated the VM) is gone, is recreated and started again by hand; any other is started with --recover."""
    if not (rec.watch or {}).get("recover"):
        return "rerun with --recover (and --set checkpoint.dir=gs://...) to recreate it and resume"
    from tpuops.cloud.locate import how_to_recreate

    again = f"`{shlex.join(rec.argv)}`" if rec.argv else "the run's command"
    return (
        f"run {rec.run_id} was started with --recover, but its client is gone: {how_to_recreate(vm)}; then "
        f"start {again} again: it resumes from its last checkpoint"
    )
