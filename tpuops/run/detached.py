"""What is done with a run started earlier, from its record: attach (follow it again and judge its end),
logs, stop, and each run's state (`tpuops runs`). `tpuops report RUN_ID` is run/review.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tpuops import config as user_config
from tpuops import shell
from tpuops.errors import ExitCode, PreemptedError, TpuopsError
from tpuops.logs.chunks import file_lines
from tpuops.logs.events import NOSPACE, STOPPED, Event, ExitEvent, LogReport, exit_status
from tpuops.logs.follow import Follower, Readings
from tpuops.run import finish, profile, scan
from tpuops.run.store import (
    HANG_KEYS,
    HangWatch,
    OffsetWriter,
    ResultRecord,
    RunRecord,
    ScanRecord,
    load,
    record_end,
    save_result,
    saved_offsets,
)
from tpuops.run.target import Target, reach_again, select_workers
from tpuops.run.vmwatch import recovery_hint, watched_as_run
from tpuops.shell import Redactor
from tpuops.sop.actions import Fetch, Follow
from tpuops.transport.base import CmdResult, Kind, LineSink, Transport


@dataclass(frozen=True)
class Attached:
    """How an attach ended: the run's log report, its exit code, workers that could not be followed (why)."""

    run_id: str
    log: LogReport
    code: int
    lost: dict[int, str]
    hint: str | None = None  # what to do about it (a recompile check that saw nothing: exit 13)
    detached: bool = False  # Ctrl-C stopped following: the job goes on, nothing was fetched or recorded


def attach(
    run_id: str,
    *,
    on_line: LineSink | None,
    stream: str = "first",
    timeout: float = 86400.0,
    from_start: bool = False,
    detach: threading.Event | None = None,
    on_past: LineSink | None = None,
) -> Attached:
    """Follow a detached run from the byte offset already shown, fetch its logs, judge and record its end.

    The workers are reached by the route the run logged in by (no cloud API call; the VM is looked up again
    only when that route fails), and watched as the run watched them: its hang watch, and a VM run's VM with the
    run's own `unreachable_s` (a lost VM is exit 8, and for a run started with --recover the error says how to
    recover it).
    The lines shown before (by the run's own follow, in a process now gone) are not shown again, but this
    follower's scanners read each log from its start: the report judges the whole log, each line once.
    `detach`, set from outside (Ctrl-C), stops following at once: the job goes on, the offsets shown so far
    are kept for the next attach, and nothing is fetched, judged or recorded (`Attached.detached`).
    `on_past` hears the lines shown before (the live view's total, step times and ETA), unshown."""
    rec = load(run_id)
    redact = rec.redactor()
    exits: dict[int, int | None] = {}

    def ended(event: Event) -> None:  # the scanner's exit events: which workers' jobs ended, and how
        if isinstance(event, ExitEvent):
            exits[event.worker] = event.code

    target, transport = reach_again(rec.spec(), rec.route, rec.workers, redact)
    try:
        learn_sent_env(rec, transport, redact)
        judged: ScanRecord = rec.scan or {}
        pattern = judged.get("step_pattern") or rec.values.get("step_pattern")
        follower = Follower(
            transport, redact=redact, on_line=on_line, on_past=on_past, on_event=ended,
            offsets={} if from_start else saved_offsets(run_id), on_offset=None if from_start else OffsetWriter(run_id),
            detach=detach or threading.Event(),
            reads=Readings(int(judged.get("warmup", 1)), str(pattern) if pattern else None),
        )  # fmt: skip
        results = _follow_watched(rec, target, follower, _follow_as_run(rec, stream, timeout))
        if follower.detach.is_set() or any(r.kind is Kind.DETACHED for r in results.values()):
            return Attached(run_id, LogReport(), int(ExitCode.INTERRUPTED), {}, detached=True)
        _fetch(rec, follower, transport)
    finally:
        transport.close()
    return _judged(rec, follower.reads, results, exits)


def _follow_watched(
    rec: RunRecord, target: Target, follower: Follower, follow: Follow
) -> dict[int, CmdResult]:
    """Every worker followed while a VM run's VM is watched as the run watched it; a lost VM raises exit 8."""
    with watched_as_run(rec, target, follower.abort) as lost:
        results = follower.follow_all(rec.workers, follow)
    if lost is not None and lost.error is not None:
        raise lost.error  # the watch itself failed for good (a permission error: exit 6, naming the role)
    if lost is not None and lost.event.is_set():
        assert target.vm is not None
        raise PreemptedError(
            f"{target.vm.name} {lost.why} while attached to run {rec.run_id}",
            hint=recovery_hint(rec, target.vm),
        )
    return results


def _fetch(rec: RunRecord, follower: Follower, transport: Transport) -> None:
    """Each worker's log and exit file copied here; the traced steps too (--profile-steps: `report --html`)."""
    for w in rec.workers:
        follower.fetch(w, Fetch(rec.remote_dir), user_config.state_home() / "runs")
    if (steps := profile.asked_steps(rec.values)) is not None:
        profile.fetch_steps(transport, rec.remote_dir, rec.workers, rec.local_dir, steps)


def _judged(
    rec: RunRecord, reads: Readings, results: dict[int, CmdResult], exits: dict[int, int | None]
) -> Attached:
    """The followed run's one verdict (run/finish.judge, from what the follow and the fetch read), recorded."""
    log = scan.run_report(reads.report(), rec.local_dir)
    lost = {
        w: r.error or r.stderr.strip() or f"exit {r.exit_code}"
        for w, r in sorted(results.items())
        if not r.ok
    }
    stopped = finish.stopped_workers(rec.local_dir) | {
        w for w, r in results.items() if STOPPED in r.job_notes
    }
    hung = any(r.kind is Kind.HUNG for r in results.values())
    config, accelerator = finish.named(rec.values, rec.estimate)
    verdict = finish.judge(
        log, stopped=stopped, lost=bool(lost) and not hung, hung=hung,
        fail_on_recompile=bool(rec.scan and rec.scan.get("fail_on_recompile")), config=config, accelerator=accelerator,
    )  # fmt: skip
    record_end(rec.run_id, exits, verdict.code)
    return Attached(rec.run_id, log, int(verdict.code), lost, verdict.hint)


def _follow_as_run(rec: RunRecord, stream: str, timeout: float) -> Follow:
    """The follow of attach, with the run's own hang watch (its follow step's, kept in the run record)."""
    kept = (rec.watch.get("follow") if rec.watch else None) or {}
    hang: HangWatch = {}
    for k in HANG_KEYS:  # a record of another tpuops version may keep more
        if k in kept:
            hang[k] = kept[k]
    return Follow(rec.remote_dir, stream=stream, timeout=timeout, **hang)


def learn_sent_env(rec: RunRecord, transport: Transport, redact: Redactor) -> None:
    """When values the run was sent are known only by their hashes (the local .env changed since), read the
    .env the workers have (worker 0's, where sync_env put it): its values are redacted in clear, the fast way."""
    from tpuops.config import secrets

    paths = rec.secret_digests.get("worker_files", []) if rec.secret_digests else []
    for path in paths if redact.unknown_hashed else []:
        try:
            data = transport.read_from(rec.workers[0], path, 0, 1 << 20)
        except (OSError, EOFError, TpuopsError):
            continue  # the hashes still redact them, more slowly
        if data:
            redact.add(secrets.parse(data)[0].values())


def chosen_workers(run_id: str, worker: str) -> list[int]:
    """The workers of a run that `--worker` names (all, 0, 0,2)."""
    return select_workers(worker, max(load(run_id).workers) + 1)


def logs(run_id: str, worker: str, *, follow: bool, on_line: LineSink) -> None:
    """Print worker logs (the remote file; the local copy when the VM is gone)."""
    rec = load(run_id)
    chosen = chosen_workers(run_id, worker)
    local = [rec.local_dir / f"worker-{w}.log" for w in chosen]
    if not follow and all(p.exists() for p in local):
        for w, p in zip(chosen, local, strict=True):
            for line in file_lines(p):  # a chunk at a time, a long line in pieces: memory stays a few chunks
                on_line(w, line)  # fetched copies were redacted when they were written
        return
    redact = rec.redactor()
    _, transport = reach_again(rec.spec(), rec.route, chosen, redact)
    try:
        learn_sent_env(rec, transport, redact)
        follower = Follower(transport, redact=redact, on_line=on_line)
        if not follow:
            for w in chosen:
                follower.show_log(w, f"{rec.remote_dir}/worker-{w}.log")
            return
        follower.follow_all(chosen, Follow(rec.remote_dir, "all", 86400.0))
    finally:
        transport.close()


@dataclass(frozen=True)
class Stopped:
    """What `stop` did on each worker; exit code 0 when every worker's stop script succeeded."""

    results: dict[int, CmdResult]

    @property
    def code(self) -> int:
        return 0 if all(r.ok for r in self.results.values()) else 1


def stop(run_id: str, *, grace_s: float = 10.0) -> Stopped:
    """Stop a run on every worker at once: SIGTERM to its process group, then SIGKILL, then the exit file
    (`143 stopped` unless the job wrote its own), the run lock given back and the TPU lock cleared.
    Also stops a run whose client died while it prepared the workers (its lock's stand-in holder)."""
    from concurrent.futures import ThreadPoolExecutor

    rec = load(run_id)
    _, transport = reach_again(rec.spec(), rec.route, rec.workers, rec.redactor())

    def one(w: int) -> CmdResult:
        return transport.run(w, _stop_script(rec, w, grace_s), timeout=grace_s + 30)

    try:
        # In parallel: a multi-host job that ignores SIGTERM costs one grace period, not one per worker.
        with ThreadPoolExecutor(max_workers=max(1, min(len(rec.workers), 32))) as pool:
            stopped = Stopped(dict(zip(rec.workers, pool.map(one, rec.workers), strict=True)))
    finally:
        transport.close()
    _record_stopped(rec, stopped)
    return stopped


def _stop_script(rec: RunRecord, w: int, grace_s: float) -> str:
    """The shell script that stops worker `w`'s job of the run (and gives back the run's locks)."""
    from tpuops.sop.claim import HELPERS

    lock = str(rec.values.get("lockfile", "/tmp/libtpu_lockfile"))
    # The job leads its own process group (setsid): signal and wait for the whole group, since a child
    # can outlive the leader. `kill -SIG -PGID`, not `kill -SIG -- -PGID`: dash has no `--`.
    return f"""{HELPERS}
rd={shell.path(rec.remote_dir)}; k={w}; tpu={shell.path(lock)}; rid={shell.quote(rec.run_id)}
if [ "$(cat "$lock/run" 2>/dev/null)" = "$rid" ]; then : > "$lock/stopping"; fi  # nothing of it starts now
pid=$(pid_of "$rd/worker-$k.pid")
if [ ! -f "$rd/worker-$k.pid" ]; then echo "tpuops: no pid file"
elif [ -z "$pid" ] || ! running "$pid"; then echo "tpuops: not running"; else
  kill -TERM "-$pid" 2>/dev/null || kill -TERM "$pid"
  i=0; while running "$pid" && [ $i -lt {int(grace_s * 10)} ]; do sleep 0.1; i=$((i+1)); done
  if running "$pid"; then
    kill -KILL "-$pid" 2>/dev/null || kill -KILL "$pid"; echo "tpuops: killed"
  else echo "tpuops: terminated"; fi
  while running "$pid"; do sleep 0.05; done
  [ -e "$rd/worker-$k.exit" ] || put_exit "$rd" $k "143 {STOPPED}"
fi
if [ "$(cat "$lock/run" 2>/dev/null)" = "$rid" ]; then
  stop_step  # a git sync or venv of the run still preparing the workers
  h=$(pid_of "$lock/pid"); [ -n "$h" ] && [ "$h" != "$pid" ] && held && kill "$h" 2>/dev/null
  rm -rf "$lock"; echo "tpuops: run lock released"; fi
if [ -f "$rd/worker-$k.exit" ]; then set -- $(cat "$rd/worker-$k.exit"); echo "tpuops: exit code=$1 note=${{2:-}}"; fi
rm -f "$tpu" && echo "tpuops: lock cleared"
"""


def _record_stopped(rec: RunRecord, stopped: Stopped) -> None:
    """Stopped, and no worker had failed before: `tpuops runs` says so from now on, also offline. A run one of
    whose jobs had already failed (or that was judged already) keeps no result here: attach or report judge it
    from its logs."""
    ended = {w: _exit_marker(r) for w, r in stopped.results.items()}
    halted = {w for w, (_, note) in ended.items() if note == STOPPED}
    if (
        rec.result is None
        and stopped.code == 0
        and halted
        and all(c == 0 or w in halted for w, (c, _) in ended.items())
    ):
        save_result(
            rec.run_id,
            {"run_id": rec.run_id, "sop": rec.sop, "ok": False, "exit_code": int(ExitCode.STOPPED),
             "exit_codes": {str(w): c for w, (c, _) in ended.items()}, "stopped": True},
        )  # fmt: skip


def _exit_marker(r: CmdResult) -> tuple[int | None, str]:
    from tpuops.sop.model import markers

    for m in markers(r.stdout):
        if m["_"].startswith("exit "):
            return exit_status(m.get("code", ""))[0], m.get("note", "")
    return None, ""


@dataclass(frozen=True)
class RunState:
    """What `tpuops runs` says of one run: from its saved result, or asked of its workers just now."""

    record: RunRecord
    state: str  # running, exited N, stopped, lost, interrupted, ok, failed (N), unknown
    detail: str = ""  # why the state is unknown (the workers could not be reached), or per-worker notes


def states(records: list[RunRecord], *, ask: bool = True, timeout_s: float = 20.0) -> list[RunState]:
    """Each run's real state: a finished one from its saved result; one with no result (still running, or
    its client went away) from the workers' pid and exit files, asked in parallel per target (`ask=False`:
    not asked, "unknown"). A target that cannot be reached within `timeout_s` is said as such."""
    from concurrent.futures import ThreadPoolExecutor, wait

    out: dict[str, RunState] = {}
    open_runs = []
    for rec in records:
        if rec.result is not None:
            out[rec.run_id] = RunState(rec, _finished_state(rec.result))
        else:
            open_runs.append(rec)
    if open_runs and ask:
        pool = ThreadPoolExecutor(max_workers=min(8, len(open_runs)))
        futures = {pool.submit(_ask, rec): rec for rec in open_runs}
        done, _ = wait(futures, timeout=timeout_s)
        for f, rec in futures.items():
            if f in done:
                out[rec.run_id] = f.result()
            else:
                out[rec.run_id] = RunState(
                    rec, "unknown", f"the workers did not answer within {timeout_s:g}s"
                )
        pool.shutdown(wait=False, cancel_futures=True)
    for rec in open_runs:
        out.setdefault(rec.run_id, RunState(rec, "unknown", "not asked"))
    return [out[r.run_id] for r in records]


def _finished_state(result: ResultRecord) -> str:
    if result.get("stopped") or result.get("exit_code") == ExitCode.STOPPED:
        return "stopped"
    if result.get("interrupted"):
        return str(result["interrupted"])
    return "ok" if result.get("ok") else f"failed ({result.get('exit_code')})"


def _ask(rec: RunRecord) -> RunState:
    """One run's workers asked what became of its job: running, exited N, stopped, lost."""
    from tpuops.errors import TpuopsError
    from tpuops.sop.claim import HELPERS
    from tpuops.sop.model import markers

    rd = shell.path(rec.remote_dir)
    try:
        _, transport = reach_again(rec.spec(), rec.route, rec.workers, rec.redactor())
    except TpuopsError as e:
        return RunState(rec, "unknown", f"could not reach the workers: {e.line()}")
    found: dict[int, dict[str, str]] = {}
    try:
        for w in rec.workers:
            script = f"""{HELPERS}
rd={rd}; k={w}; rid={shell.quote(rec.run_id)}; pid=$(pid_of "$rd/worker-$k.pid")
if [ -f "$rd/worker-$k.exit" ]; then set -- $(cat "$rd/worker-$k.exit"); echo "tpuops: state=exited code=$1 note=${{2:-}}"
elif [ -n "$pid" ] && running "$pid"; then echo "tpuops: state=running pid=$pid"
elif [ "$(cat "$lock/run" 2>/dev/null)" = "$rid" ] && running "$(pid_of "$lock/pid")"; then echo "tpuops: state=starting"
else echo "tpuops: state=lost"; fi
"""
            try:
                r = transport.run(w, script, timeout=15)
            except TpuopsError as e:
                return RunState(rec, "unknown", f"could not reach w{w}: {e.line()}")
            m = next((m for m in markers(r.stdout) if "state" in m), None)
            if not r.ok or m is None:
                return RunState(rec, "unknown", f"could not read w{w}: {r.error or r.stderr.strip()}")
            found[w] = m
    finally:
        transport.close()
    kinds = {m["state"] for m in found.values()}
    if "running" in kinds or "starting" in kinds:
        state = "running" if "running" in kinds else "starting"
        lost = [w for w, m in found.items() if m["state"] != state]
        return RunState(rec, state, f"not on {', '.join(f'w{w}' for w in lost)}" if lost else "")
    if kinds == {"exited"}:
        halted = {w for w, m in found.items() if m.get("note") == STOPPED}
        if halted and all(w in halted or m["code"] == "0" for w, m in found.items()):
            return RunState(rec, "stopped")
        codes = sorted({int(m["code"]) for m in found.values()})
        nospace = [w for w, m in found.items() if m.get("note") == NOSPACE]
        note = f"no space left on device on {', '.join(f'w{w}' for w in nospace)}" if nospace else ""
        return RunState(rec, f"exited {max(codes, key=abs)}", note)
    lost = [w for w, m in found.items() if m["state"] == "lost"]
    return RunState(rec, "lost", f"no job and no exit code on {', '.join(f'w{w}' for w in lost)}")
