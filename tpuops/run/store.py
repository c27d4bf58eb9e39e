"""Runs on this machine: their records (run.json, result.json, follow offsets) and, from them, attach, logs, stop."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuops import config as user_config
from tpuops import jsonout, shell
from tpuops.config import TargetSpec, write_atomic
from tpuops.errors import ExitCode, TpuopsError, UsageError
from tpuops.logs.events import NOSPACE, STOPPED, Event, ExitEvent, LogReport, exit_status
from tpuops.logs.follow import Follower, Readings
from tpuops.run import logreport, scan
from tpuops.run.result import unverified
from tpuops.run.target import open_transport, resolve, select_workers
from tpuops.shell import Redactor
from tpuops.sop.actions import Fetch, Follow
from tpuops.sop.runs import run_dir
from tpuops.transport.base import CmdResult, Kind, LineSink, Transport


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    sop: str
    target: dict[str, Any]
    workers: list[int]
    values: dict[str, Any]
    started: float
    result: dict[str, Any] | None = None  # the JSON report once the SOP finished
    secret_files: tuple[str, ...] = ()  # the local .env files whose values the run's logs must not show
    runs_dir: str | None = None  # the run step's runs_dir on the workers (older records: the parameter)
    secret_digests: dict[str, Any] | None = (
        None  # keyed hashes of the .env values sent (launch._secret_digests)
    )
    scan: dict[str, Any] | None = None  # the SOP's scan settings (warmup, fail_on_recompile, step_pattern)

    def redactor(self) -> Redactor:
        """Redacts from what the workers' logs say the values of the run's .env files as they are now, and the
        values that were sent with the run (kept as keyed hashes) even after the local files changed."""
        from tpuops.sop import secrets

        files = [Path(f) for f in self.secret_files if Path(f).is_file()]
        # Read leniently: redaction must work even if a file was since edited into one tpuops would not send.
        redact = Redactor(v for f in files for v in secrets.parse(f.read_bytes())[0].values())
        if self.secret_digests:
            redact.add_hashed(bytes.fromhex(self.secret_digests["key"]), self.secret_digests["forms"])
        return redact

    @property
    def local_dir(self) -> Path:
        return user_config.state_home() / "runs" / self.run_id

    @property
    def remote_dir(self) -> str:
        return run_dir(self.runs_dir or str(self.values.get("runs_dir", "~/tpuops/runs")), self.run_id)

    def spec(self) -> TargetSpec:
        """The recorded target; keys a record of another tpuops version has and this one does not are left out."""
        known = {f.name for f in dataclasses.fields(TargetSpec)}
        t: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in self.target.items() if k in known
        }
        return TargetSpec(**t)


def load(run_id: str) -> RunRecord:
    d = user_config.state_home() / "runs" / run_id
    if not (d / "run.json").exists():
        known = [r.run_id for r in list_runs()[:5]]
        raise UsageError(f"no run {run_id!r} in {d.parent}", hint=f"recent: {', '.join(known) or 'none'}")
    try:
        data = json.loads((d / "run.json").read_text())
        result = json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else None
    except ValueError:  # written before records were atomic, and cut short
        raise UsageError(
            f"run record {d} is unreadable (an interrupted write)", hint="remove that folder"
        ) from None
    return RunRecord(
        **{k: data[k] for k in ("run_id", "sop", "target", "workers", "values", "started")},
        result=result,
        secret_files=tuple(data.get("secret_files", ())),
        runs_dir=data.get("runs_dir"),
        secret_digests=data.get("secret_digests"),
        scan=data.get("scan"),
    )


def list_runs() -> list[RunRecord]:
    root = user_config.state_home() / "runs"
    ids = sorted((p.parent.name for p in root.glob("*/run.json")), reverse=True) if root.exists() else []
    out = []
    for i in ids:
        try:
            out.append(load(i))
        except UsageError:
            continue  # an unreadable record is not a run to list (`tpuops logs ID` says what is wrong)
    return out


def offsets_path(run_id: str) -> Path:
    return user_config.state_home() / "runs" / run_id / "follow.json"


class OffsetWriter:
    """Persists how far each worker's log was shown, so `attach` resumes exactly there."""

    def __init__(self, run_id: str) -> None:
        self.path = offsets_path(run_id)
        self.lock = threading.Lock()

    def __call__(self, offsets: dict[int, int]) -> None:
        with self.lock:
            write_atomic(self.path, json.dumps({str(k): v for k, v in offsets.items()}))


def saved_offsets(run_id: str) -> dict[int, int]:
    p = offsets_path(run_id)
    return {int(k): v for k, v in json.loads(p.read_text()).items()} if p.exists() else {}


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
) -> Attached:
    """Follow a detached run from the byte offset already shown, fetch its logs, judge and record its end.

    The lines shown before (by the run's own follow, in a process now gone) are not shown again, but this
    follower's scanners read each log from its start: the report judges the whole log, each line once.
    `detach`, set from outside (Ctrl-C), stops following at once: the job goes on, the offsets shown so far
    are kept for the next attach, and nothing is fetched, judged or recorded (`Attached.detached`)."""
    rec = load(run_id)
    redact = rec.redactor()
    exits: dict[int, int | None] = {}
    judged = rec.scan or {}
    pattern = judged.get("step_pattern") or rec.values.get("step_pattern")

    def ended(event: Event) -> None:  # the scanner's exit events: which workers' jobs ended, and how
        if isinstance(event, ExitEvent):
            exits[event.worker] = event.code

    transport = open_transport(resolve(rec.spec()), redact)
    learn_sent_env(rec, transport, redact)
    follower = Follower(
        transport,
        redact=redact,
        on_line=on_line,
        on_event=ended,
        offsets={} if from_start else saved_offsets(run_id),
        on_offset=None if from_start else OffsetWriter(run_id),
        detach=detach or threading.Event(),
        reads=Readings(int(judged.get("warmup", 1)), pattern),
    )
    try:
        results = follower.follow_all(rec.workers, Follow(rec.remote_dir, stream=stream, timeout=timeout))
        if follower.detach.is_set() or any(r.kind is Kind.DETACHED for r in results.values()):
            return Attached(run_id, LogReport(), int(ExitCode.INTERRUPTED), {}, detached=True)
        for w in rec.workers:
            follower.fetch(w, Fetch(rec.remote_dir), user_config.state_home() / "runs")
    finally:
        transport.close()
    log = scan.run_report(follower.reads.report(), rec.local_dir)  # what the follow and the fetch read
    lost = {
        w: r.error or r.stderr.strip() or f"exit {r.exit_code}"
        for w, r in sorted(results.items())
        if not r.ok
    }
    code = max(logreport.exit_code(log), 1 if lost else 0)
    hint = unverified(log, bool(judged.get("fail_on_recompile"))) if code == 0 else None
    if hint:  # a recompile check that saw no step line or no compile logging: never ok (as when it ran)
        code = int(ExitCode.UNVERIFIED)
    record_end(run_id, exits, code)
    return Attached(run_id, log, code, lost, hint)


def learn_sent_env(rec: RunRecord, transport: Transport, redact: Redactor) -> None:
    """When values the run was sent are known only by their hashes (the local .env changed since), read the
    .env the workers have (worker 0's, where sync_env put it): its values are redacted in clear, the fast way."""
    from tpuops.sop import secrets

    paths = (rec.secret_digests or {}).get("worker_files", [])
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
            with p.open(errors="replace") as f:  # a line at a time: memory does not grow with the log
                for line in f:
                    on_line(w, line.rstrip("\n"))  # fetched copies were redacted when they were written
        return
    redact = rec.redactor()
    transport = open_transport(resolve(rec.spec()), redact)
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

    from tpuops.sop.claim import HELPERS

    rec = load(run_id)
    lock = str(rec.values.get("lockfile", "/tmp/libtpu_lockfile"))
    rd = shell.path(rec.remote_dir)
    transport = open_transport(resolve(rec.spec()), rec.redactor())

    def one(w: int) -> CmdResult:
        # The job leads its own process group (setsid): signal and wait for the whole group, since a child
        # can outlive the leader. `kill -SIG -PGID`, not `kill -SIG -- -PGID`: dash has no `--`.
        script = f"""{HELPERS}
rd={rd}; k={w}; tpu={shell.path(lock)}; rid={shell.quote(run_id)}
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
  h=$(pid_of "$lock/pid"); [ -n "$h" ] && [ "$h" != "$pid" ] && kill "$h" 2>/dev/null
  rm -rf "$lock"; echo "tpuops: run lock released"; fi
if [ -f "$rd/worker-$k.exit" ]; then set -- $(cat "$rd/worker-$k.exit"); echo "tpuops: exit code=$1 note=${{2:-}}"; fi
rm -f "$tpu" && echo "tpuops: lock cleared"
"""
        return transport.run(w, script, timeout=grace_s + 30)

    try:
        # In parallel: a multi-host job that ignores SIGTERM costs one grace period, not one per worker.
        with ThreadPoolExecutor(max_workers=max(1, min(len(rec.workers), 32))) as pool:
            stopped = Stopped(dict(zip(rec.workers, pool.map(one, rec.workers), strict=True)))
    finally:
        transport.close()
    if rec.result is None and stopped.code == 0:  # `tpuops runs` says so from now on, also offline
        codes = {str(w): _exit_marker(r)[0] for w, r in stopped.results.items()}
        save_result(
            run_id,
            {"run_id": run_id, "sop": rec.sop, "ok": False, "exit_code": int(ExitCode.TERMINATED),
             "exit_codes": codes, "stopped": True},
        )  # fmt: skip
    return stopped


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


def _finished_state(result: dict[str, Any]) -> str:
    if result.get("stopped"):
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
        transport = open_transport(resolve(rec.spec()), rec.redactor())
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
        if any(m.get("note") == STOPPED for m in found.values()):
            return RunState(rec, "stopped")
        codes = sorted({int(m["code"]) for m in found.values()})
        nospace = [w for w, m in found.items() if m.get("note") == NOSPACE]
        note = f"no space left on device on {', '.join(f'w{w}' for w in nospace)}" if nospace else ""
        return RunState(rec, f"exited {max(codes, key=abs)}", note)
    lost = [w for w, m in found.items() if m["state"] == "lost"]
    return RunState(rec, "lost", f"no job and no exit code on {', '.join(f'w{w}' for w in lost)}")


def record_end(run_id: str, exit_codes: dict[int, int | None], code: int) -> None:
    """After an attach: once every worker has an exit code, remember how the run ended (`tpuops runs`).

    The follower that started the run saved a fuller result if it saw the end; that one is kept.
    """
    rec = load(run_id)
    if rec.result is None and all(exit_codes.get(w) is not None for w in rec.workers):
        codes = {str(w): exit_codes[w] for w in rec.workers}
        save_result(
            run_id,
            {"run_id": run_id, "sop": rec.sop, "ok": code == 0, "exit_code": code, "exit_codes": codes},
        )


def save_result(run_id: str, data: dict[str, Any]) -> None:
    d = user_config.state_home() / "runs" / run_id
    write_atomic(d / "result.json", jsonout.dumps({**data, "finished": time.time()}))
