"""`--recover`: follow a run while watching the VM; on preemption recreate it, rerun the SOP, resume."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from tpuops.errors import PreemptedError, TpuopsError
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
    runs this way), instead of a follow that waits for workers that will not come back.

    Lost: the TPU API says PREEMPTED (or TERMINATED), or no worker has accepted a TCP connection on its SSH
    port for `unreachable_s` while the API still says otherwise (a host gone without a state change yet). An
    attempt that fails asks the API once more before it reports, so a VM lost since the watch's last poll is
    exit 8, not the refused connection it caused.
    The watch polls with the target's own client, its calls marked `watch` (the emulator's request log
    tells them apart). `notify` hears the TPU API's retries of a re-resolve.
    The trainer resumes from its latest checkpoint, which must live off the VM (gs://..., or a shared
    path in tests). Each recovery is recorded: when, how long, why, the last step seen, the step resumed at
    (from the follower's step events of process 0: the log is not read a second time). A permission error
    of the watch ends the run (exit 6, naming the role): it would never heal by polling again.
    A job that ended on the VM's preemption notice (sop/notice.py; the trainer checkpoints first) is followed by
    the VM's loss within seconds: the watch waits up to `notice_wait_s` for it, and a VM still there then is
    recreated all the same (its host is going).
    """
    assert target.reach is not None and target.api is not None, "only a VM target is watched"
    say = on_notice or (lambda _: None)
    vm = target.reach.vm
    recoveries: list[Recovery] = []
    seen: dict[str, int | None] = {"last": None, "first": None}

    def stepped(event: Event) -> None:  # process 0's step events say where the run stands
        if isinstance(event, StepEvent) and event.worker == 0 and event.step is not None:
            seen["first"] = event.step if seen["first"] is None else seen["first"]
            seen["last"] = event.step

    for n in range(max_recoveries + 1):
        abort = threading.Event()
        lost = Lost()
        watcher = threading.Thread(
            target=watch,
            args=(target.api.for_purpose("watch"), vm, target.reach.watch_endpoints(), watch_s, unreachable_s,
                  abort, lost),
            daemon=True,
        )  # fmt: skip
        watcher.start()
        seen["first"] = None
        noticed: tuple[bool, int | None] = (False, None)
        run_id = base_id if n == 0 else f"{base_id}-r{n}"
        try:
            result = attempt(run_id, target, abort, stepped)
        except TpuopsError:
            _check_now(target.api.for_purpose("watch"), vm, abort, watcher, watch_s, lost)
            if not lost.event.is_set():
                raise
        else:
            if not result.ok:
                noticed = ended_on_notice(result)
                if noticed[0]:
                    _await_loss(vm.name, noticed[1], abort, lost, notice_wait_s, say)
                _check_now(target.api.for_purpose("watch"), vm, abort, watcher, watch_s, lost)
        finally:
            abort.set()  # also stops the watcher
            watcher.join(timeout=watch_s + 5)
        if recoveries and recoveries[-1]["resumed_step"] is None:
            rec = recoveries[-1]
            rec["resumed_step"] = seen["first"]
            if seen["first"] is not None and rec["last_step"] is not None:
                rec["steps_lost"] = int(rec["last_step"]) + 1 - int(seen["first"])
        if lost.error is not None:
            raise lost.error
        if not lost.event.is_set():
            return replace(result, recoveries=tuple(recoveries))
        if max_recoveries == 0:
            kept = f"; {notice_words(noticed[1])}" if noticed[0] else "; the run is lost with it"
            raise PreemptedError(
                f"{vm.name} {lost.why} {at_step(seen['last'])}{kept}",
                hint="rerun with --recover (and --set checkpoint.dir=gs://...) to recreate it and resume",
            )
        if n == max_recoveries:
            raise PreemptedError(
                f"{vm.name} was lost {n + 1} times (last: {lost.why}); gave up after {max_recoveries} "
                "recoveries",
                hint="try another zone, or a reserved (non-spot) VM",
            )
        say(f"{vm.name} {lost.why} {at_step(seen['last'])}; recreating it ({n + 1}/{max_recoveries})")
        t0 = time.monotonic()
        # A VM that recreates only its lost workers (a MIG) leaves the others running this attempt's job.
        if _recreate(target.api, vm, target.spec, ready_timeout):
            _stop_survivors(run_id, say)
        # The recreated VM has new host keys and addresses: the one legitimate second resolve.
        target = resolve(target.spec, target.config, notify, api=target.api)
        assert target.reach is not None
        vm = target.reach.vm
        recoveries.append(
            {
                "at": time.time(),
                "why": lost.why,
                "duration_s": round(time.monotonic() - t0, 2),
                "last_step": seen["last"],
                "resumed_step": None,
                "steps_lost": None,
                "run_id": f"{base_id}-r{n + 1}",
                **({"notice": True, "notice_checkpoint": noticed[1]} if noticed[0] else {}),
            }
        )
        say(f"{vm.name} is READY again after {time.monotonic() - t0:.1f}s; rerunning {sop}")
    raise AssertionError("unreachable")


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


def _check_now(api, vm, abort: threading.Event, watcher: threading.Thread, every: float, lost: Lost) -> None:
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
