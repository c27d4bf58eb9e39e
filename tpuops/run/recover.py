"""`--recover`: follow a run while watching the VM; on preemption recreate it, rerun the SOP, resume."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tpuops.errors import TpuopsError
from tpuops.logs.events import Event, StepEvent, at_step
from tpuops.run.result import Recovery, RunResult
from tpuops.run.target import Target, resolve
from tpuops.run.vmwatch import Lost, lost_reason, watch

if TYPE_CHECKING:  # the cloud modules load only on a VM target
    from tpuops.cloud.client import Api
    from tpuops.cloud.tpu_api import VmInfo
    from tpuops.config import TargetSpec

NOTICE_WAIT_S = 120.0  # after a preemption notice: a Spot VM goes in 30 s, a host maintenance in 60 s
# One attempt of the run on a target: (run id, the target, an event that aborts it, a sink for the follower's
# typed log events) -> its result. launch.start passes it in, so recovery needs nothing of launch (and
# launch may import this module).
Attempt = Callable[[str, Target, threading.Event, Callable[[Event], None]], RunResult]


@dataclass
class _Seen:
    """Where the run stands, from process 0's step events (the log is not read a second time): the last step
    seen, and the first of the current attempt."""

    last: int | None = None
    first: int | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, StepEvent) and event.worker == 0 and event.step is not None:
            self.first = event.step if self.first is None else self.first
            self.last = event.step


@dataclass(frozen=True)
class _Attempted:
    """One attempt under the watch: its result (None when it raised because its VM went), whether the VM was
    lost, and whether its job ended on the VM's preemption notice (with the checkpoint's step)."""

    result: RunResult | None
    lost: Lost
    noticed: tuple[bool, int | None] = (False, None)


@dataclass(frozen=True)
class _Watch:
    """How each attempt is watched (`watched`'s settings)."""

    every: float
    unreachable_s: float
    notice_wait_s: float
    say: Callable[[str], None]


def watched(
    target: Target,
    attempt: Attempt,
    *,
    base_id: str,
    sop: str,
    max_recoveries: int = 3,
    watch_s: float = 10.0,
    unreachable_s: float = 300.0,
    ready_timeout: float = 1800.0,
    on_notice: Callable[[str], None] | None = None,
    notify: Callable[[str], None] | None = None,
    notice_wait_s: float = NOTICE_WAIT_S,
) -> RunResult:
    """Run `attempt` on the VM while watching it; whenever the VM is lost, recreate it (same type, zone,
    runtime), resolve it again and run it again.

    With max_recoveries=0 this only watches: a lost VM ends the run at once with exit 8 (every SOP on a VM
    runs this way), instead of a follow that waits for workers that will not come back. A run that ends on a
    lost VM (or whose recoveries ran out) returns a RunResult (exit 8, its verdict from `finish.judge`) with the
    steps of its last attempt, its recoveries and what to do next.

    Lost: the TPU API says PREEMPTED (or TERMINATED), or no worker has accepted a TCP connection on its SSH
    port for `unreachable_s` while the API still says otherwise (a host gone without a state change yet). An
    attempt that fails asks the API once more before it reports, so a VM lost since the watch's last poll is
    exit 8, not the refused connection it caused.
    The watch polls with the target's own client, its calls marked `watch` (the emulator's request log
    tells them apart). `notify` hears the TPU API's retries of a re-resolve.
    The trainer resumes from its latest checkpoint, which must live off the VM (gs://..., or a shared
    path in tests). Each recovery is recorded (also in the run's result.json): when, how long, why, the last
    step seen, the step resumed at (from the follower's step events of process 0). A permission error
    of the watch ends the run (exit 6, naming the role): it would never heal by polling again.
    A job that ended on the VM's preemption notice (sop/notice.py; the trainer checkpoints first) is followed by
    the VM's loss within seconds: the watch waits up to `notice_wait_s` for it, and a VM still there then is
    recreated all the same (its host is going).
    """
    assert target.reach is not None and target.api is not None, "only a VM target is watched"
    how = _Watch(watch_s, unreachable_s, notice_wait_s, on_notice or (lambda _: None))
    recoveries: list[Recovery] = []
    seen = _Seen()
    for n in range(max_recoveries + 1):
        run_id = base_id if n == 0 else f"{base_id}-r{n}"
        seen.first = None
        done = _attempt(target, attempt, run_id, seen, how)
        if recoveries and recoveries[-1]["resumed_step"] is None:
            _resumed(recoveries[-1], seen.first)
        if done.lost.error is not None:
            raise done.lost.error
        if not done.lost.event.is_set():
            assert done.result is not None  # an attempt that raised without its VM lost raised on
            return _ended(replace(done.result, recoveries=tuple(recoveries)))
        if n == max_recoveries:
            return _lost(target, run_id, sop, done, seen, recoveries, max_recoveries)
        name = target.reach.vm.name
        how.say(f"{name} {done.lost.why} {at_step(seen.last)}; recreating it ({n + 1}/{max_recoveries})")
        t0 = time.monotonic()
        target = _made_whole(target, run_id, ready_timeout, notify, how.say)
        recoveries.append(_recovery(done, seen, t0, f"{base_id}-r{n + 1}"))
        how.say(f"{name} is READY again after {time.monotonic() - t0:.1f}s; rerunning {sop}")
    raise AssertionError("unreachable")


def _attempt(target: Target, attempt: Attempt, run_id: str, seen: _Seen, how: _Watch) -> _Attempted:
    """One attempt of the run with the VM watched beside it (a thread that sets `abort` when the VM goes). An
    attempt that fails, or raises, asks the API once more: a VM gone since the last poll explains it."""
    assert target.reach is not None and target.api is not None
    vm, api = target.reach.vm, target.api.for_purpose("watch")
    abort = threading.Event()
    lost = Lost()
    watcher = threading.Thread(
        target=watch, args=(api, vm, target.reach.watch_endpoints(), how.every, how.unreachable_s, abort, lost),
        daemon=True,
    )  # fmt: skip
    watcher.start()
    noticed: tuple[bool, int | None] = (False, None)
    try:
        result = attempt(run_id, target, abort, seen)
    except TpuopsError:
        _check_now(api, vm, abort, watcher, how.every, lost)
        if not lost.event.is_set():
            raise
        return _Attempted(None, lost)
    else:
        if not result.ok:
            noticed = ended_on_notice(result)
            if noticed[0]:
                _await_loss(vm.name, noticed[1], abort, lost, how.notice_wait_s, how.say)
            _check_now(api, vm, abort, watcher, how.every, lost)
    finally:
        abort.set()  # also stops the watcher
        watcher.join(timeout=how.every + 5)
    return _Attempted(result, lost, noticed)


def _resumed(rec: Recovery, first: int | None) -> None:
    """The recovery's resumed step (the next attempt's first step line) and the steps it ran again."""
    rec["resumed_step"] = first
    if first is not None and rec["last_step"] is not None:
        rec["steps_lost"] = int(rec["last_step"]) + 1 - int(first)


def _made_whole(
    target: Target,
    run_id: str,
    ready_timeout: float,
    notify: Callable[[str], None] | None,
    say: Callable[[str], None],
) -> Target:
    """The lost VM recreated and resolved again: the target of the next attempt."""
    assert target.reach is not None and target.api is not None
    # A VM that recreates only its lost workers (a MIG) leaves the others running this attempt's job.
    if _recreate(target.api, target.reach.vm, target.spec, ready_timeout):
        _stop_survivors(run_id, say)
    # The recreated VM has new host keys and addresses: the one legitimate second resolve.
    again = resolve(target.spec, target.config, notify, api=target.api)
    assert again.reach is not None
    return again


def _recovery(done: _Attempted, seen: _Seen, t0: float, run_id: str) -> Recovery:
    rec = Recovery(
        at=time.time(), why=done.lost.why, duration_s=round(time.monotonic() - t0, 2), last_step=seen.last,
        resumed_step=None, steps_lost=None, run_id=run_id,
    )  # fmt: skip
    if done.noticed[0]:
        rec["notice"], rec["notice_checkpoint"] = True, done.noticed[1]
    return rec


def _lost(
    target: Target,
    run_id: str,
    sop: str,
    done: _Attempted,
    seen: _Seen,
    recoveries: list[Recovery],
    most: int,
) -> RunResult:
    """The run's end on a VM lost with no recovery left (or none asked for): exit 8 from `finish.judge`, with
    the last attempt's steps (none when it could not start), the recoveries and what to do next."""
    from tpuops.run import finish
    from tpuops.sop.executor import SopReport

    assert target.reach is not None
    name, why = target.reach.vm.name, done.lost.why
    if most == 0:
        kept = f"; {notice_words(done.noticed[1])}" if done.noticed[0] else "; the run is lost with it"
        loss = finish.VmLoss(
            f"{name} {why} {at_step(seen.last)}{kept}",
            "rerun with --recover (and --set checkpoint.dir=gs://...) to recreate it and resume",
        )
    else:
        loss = finish.VmLoss(
            f"{name} was lost {len(recoveries) + 1} times (last: {why}); gave up after {most} recoveries",
            "try another zone, or a reserved (non-spot) VM",
        )
    r = done.result
    report = r.report if r is not None else SopReport(sop, run_id, "ssh", list(range(len(target.workers))))
    verdict = finish.judge(r.log if r else None, steps=report, vm_lost=loss)
    return _ended(
        RunResult(
            report, verdict.code, r.log if r else None, tuple(recoveries), verdict.hint,
            estimate=r.estimate if r else None, profile=r.profile if r else None, vm_lost=verdict.vm_lost,
        )
    )  # fmt: skip


def _ended(result: RunResult) -> RunResult:
    """A watched run's end, recorded as it is returned: its result.json with its recoveries (and, for a lost VM,
    its verdict: exit 8)."""
    from tpuops.run import finish

    if result.report.interrupted == "detached":  # the job goes on: `tpuops attach` records its end
        return result
    if result.recoveries or result.vm_lost is not None:  # else the attempt's own record says it all
        finish.save(result)
    return result


def _stop_survivors(run_id: str, say: Callable[[str], None]) -> None:
    """Stop the lost attempt's job where its instance survived (its collectives wait for the lost peers), give
    its run lock and the TPU back: else the rerun's claim finds the workers busy with this run's own past."""
    from tpuops.run import detached

    try:
        stopped = detached.stop(run_id)
    except TpuopsError as e:  # no record (nothing was started yet) or no worker reachable: the claim will say
        say(f"could not stop what is left of {run_id}: {e.line()}")
        return
    if stopped.code:
        say(f"stopping what is left of {run_id} failed on some worker; the rerun's checks will say where")


def checkpoint_warnings(sets: dict[str, str]) -> list[str]:
    """What a recovery will not be able to resume from, said before the run starts."""
    ckpt = sets.get("checkpoint.dir", "")
    if not ckpt:
        return [
            "no --set checkpoint.dir: a recovered run starts again from step 0 "
            "(set checkpoint.dir=gs://BUCKET/PATH, which outlives the VM)"
        ]
    if not ckpt.startswith("gs://"):
        return [
            f"checkpoint.dir {ckpt} is not gs://: if it is on the VM's own disk, a recreated VM does not have it "
            "and the run starts again from step 0"
        ]
    return []


def ended_on_notice(result: RunResult) -> tuple[bool, int | None]:
    """Whether the attempt's job ended on the VM's preemption notice (its exit file's note), and the step of the
    last checkpoint its log names (the trainer saves one before it exits)."""
    hit = any(o.data.get("notice") for s in result.report.steps for o in s.outcomes.values())
    return hit, (result.log.last_checkpoint_step if hit and result.log is not None else None)


def notice_words(checkpoint: int | None) -> str:
    if checkpoint is None:
        return "its job stopped on the preemption notice (its log names no checkpoint)"
    return f"checkpointed on preemption notice at step {checkpoint}"


def _await_loss(
    name: str,
    checkpoint: int | None,
    abort: threading.Event,
    lost: Lost,
    wait_s: float,
    say: Callable[[str], None],
) -> None:
    """After a notice the VM goes within seconds (30 s for a Spot VM): wait for the watch to see it (it sets
    `abort` when it does, or when it fails for good); a VM still there after `wait_s` is taken as going."""
    say(f"{name}: {notice_words(checkpoint)}; waiting up to {wait_s:g}s for the VM to go")
    if not abort.wait(wait_s):
        lost.set(f"gave a preemption notice and was still there after {wait_s:g}s")


def _check_now(
    api: Api, vm: VmInfo, abort: threading.Event, watcher: threading.Thread, every: float, lost: Lost
) -> None:
    """An attempt that failed (a worker refused its connection, a step failed) may have failed because the VM
    went: ask the API once more now, instead of reporting the symptom (exit 3) the watcher's next poll would
    have explained (exit 8)."""
    abort.set()
    watcher.join(timeout=every + 5)
    if lost.event.is_set() or lost.error is not None:
        return
    from tpuops.cloud.vm_state import refresh

    try:
        why = lost_reason(vm, refresh(api, vm))
    except Exception:  # the API cannot say: the attempt's own failure stands
        return
    if why:
        lost.set(why)


def _recreate(api: Api, vm: VmInfo, spec: TargetSpec, timeout: float) -> bool:
    """Make the lost VM whole again with the same shape, as its backend does (a Cloud TPU node or a Compute
    Engine instance deleted and created again, a multislice queued again whole, a MIG's own repair awaited).
    True when only the lost workers were made again."""
    from tpuops.cloud.vm_state import recreate

    return recreate(api, vm, spec, timeout)
