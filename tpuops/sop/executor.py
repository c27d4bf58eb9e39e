"""The one executor: runs a SOP's steps over a transport on all selected workers in parallel."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tpuops import shell
from tpuops.config import secrets
from tpuops.errors import TpuopsError
from tpuops.logs.events import Event
from tpuops.logs.follow import Follower, Readings
from tpuops.shell import MIN_SECRET_CHARS, Redactor
from tpuops.sop import claim, ports
from tpuops.sop.actions import Action, Command, Fetch, Follow, Upload, progress_sink
from tpuops.sop.loader import Sop
from tpuops.sop.locks import RunLock
from tpuops.sop.model import Outcome, PlanContext, Step, Values
from tpuops.sop.reports import Preview, SopReport, StepReport
from tpuops.sop.rules import CHECKS_TITLE, LOCK_TITLE, claims, consistency, died_of_a_signal
from tpuops.sop.status import FAILED
from tpuops.transport.base import CmdResult, LineSink, Transport

SKIP_REST = "tpuops: same"  # a check command printing this makes the rest of the step unnecessary

Plan = list[tuple[str, dict[int, list[Action]]]]


@dataclass
class Executor(RunLock):
    transport: Transport
    parallel: int = 16
    keep_going: bool = False
    force: bool = False
    local_dir: Path = field(default_factory=Path.cwd)
    local_runs: Path | None = None  # where fetch_log writes; None = no local copies
    redact: Redactor = field(default_factory=Redactor)
    on_line: LineSink | None = None  # live output of follow steps, already redacted
    on_step: Callable[[StepReport], None] | None = None
    on_event: Callable[[Event], None] | None = None  # the follower's typed log events (every worker)
    # Each worker's progress through the steps (the live view): (worker, step title, step kind, state), state
    # "begin" when the worker starts the step, then its outcome's status. Called from the workers' threads.
    on_phase: Callable[[int, str, str, str], None] | None = None
    # Bytes of each worker's log already shown; the follower starts there and keeps it current (for attach).
    offsets: dict[int, int] = field(default_factory=dict)
    # Each worker's log scanner, shared by every follow and fetch as `offsets` is: the run's one parse of its
    # logs (launch sets the SOP's scan settings and makes the run's LogReport from it).
    reads: Readings = field(default_factory=Readings)
    on_offset: Callable[[dict[int, int]], None] | None = None
    abort: threading.Event = field(default_factory=threading.Event)  # set from outside: stop following now
    # Set from outside (the first Ctrl-C): stop following and leave the job running, or, before any job
    # started, cancel what runs and leave nothing behind.
    detach: threading.Event = field(default_factory=threading.Event)

    def plan(self, sop: Sop, values: Values, run_id: str, workers: list[int]) -> Plan:
        n = len(self.transport.workers)
        first: Plan = []
        if claims(sop):
            first.append((LOCK_TITLE, {w: [self._claim_command(sop, w, n, run_id, values)] for w in workers}))
        checks = {w: self._check_actions(sop, w, n, run_id, values) for w in workers}
        if any(checks.values()):
            first.append((CHECKS_TITLE, checks))
        return first + [
            (step.title, {w: step.plan(self._ctx(sop, w, n, run_id, values)) for w in workers})
            for step in sop.steps
        ]

    def preview(self, sop: Sop, values: Values, run_id: str, workers: list[int]) -> list[Preview]:
        """Each step's read-only preview on every worker, in parallel (a dry run's look at what it would change:
        git sync's local edits). Nothing is written; a worker that cannot be read says why."""
        n = len(self.transport.workers)
        asks = [
            (step, w, actions)
            for step in sop.steps
            for w in workers
            if (actions := step.preview(self._ctx(sop, w, n, run_id, values)))
        ]

        def one(ask: tuple[Step, int, list[Action]]) -> Preview:
            step, w, actions = ask
            try:
                results = self._run_actions(w, actions, threading.Event())
            except TpuopsError as e:
                return Preview(step.title, w, [], self.redact(e.line()), step.preview_words)
            last = results[-1] if results else None
            if last is None or not last.ok:
                why = (
                    "nothing ran"
                    if last is None
                    else last.error or last.stderr.strip() or f"exit {last.exit_code}"
                )
                return Preview(step.title, w, [], self.redact(why), step.preview_words)
            return Preview(
                step.title, w, [self.redact(x) for x in step.previewed(results)], None, step.preview_words
            )

        if not asks:
            return []
        with ThreadPoolExecutor(max_workers=max(1, min(self.parallel, len(asks)))) as pool:
            return list(pool.map(one, asks))

    def _ctx(self, sop: Sop, worker: int, n: int, run_id: str, values: dict[str, object]) -> PlanContext:
        paths = frozenset(k for k, p in sop.params.items() if p.type == "path")
        coordinator = ports.coordinator_host(
            self.transport.workers, worker
        )  # as this worker reaches worker 0
        slices = len({w.slice_index for w in self.transport.workers})
        here = self.transport.workers[worker].slice_index if worker < n else 0
        return PlanContext(
            worker, n, run_id, values, self.force, self.local_dir, paths, coordinator, here, slices
        )

    def execute(self, sop: Sop, values: Values, run_id: str, workers: list[int]) -> SopReport:
        """Claim the run lock on every worker, run every read-only check, and only then the steps: a start
        refused anywhere changes nothing anywhere. A job starts on every worker or on none."""
        t0 = time.monotonic()
        report = SopReport(sop.name, run_id, self.transport.name, list(workers))
        active = list(workers)
        claimed: list[int] = []
        holding: set[int] = set()  # workers where this run's job holds the lock now (it gives it back itself)
        with ThreadPoolExecutor(max_workers=max(1, min(self.parallel, len(workers)))) as pool:
            try:
                if claims(sop) and active:
                    claim = self._claim(pool, sop, values, run_id, active)
                    claimed = [w for w in active if claim.outcomes[w].status in ("ok", "changed", "nothing")]
                    if claim.failed or any(o.status == "changed" for o in claim.outcomes.values()):
                        self._add(
                            report, claim
                        )  # shown when it refused or had to stop or take over something
                    if claim.failed:
                        return self._done(report, t0)
                checks = self._checks(pool, sop, values, run_id, active)
                if checks is not None:
                    self._add(report, checks)
                    if checks.failed:
                        return self._done(report, t0)
                self._steps(pool, sop, values, run_id, active, report, holding)
            finally:
                release = [w for w in claimed if w not in holding]
                if release:
                    ended = dict(
                        zip(release, pool.map(lambda w: self._release(w, run_id), release), strict=True)
                    )
                    report.stopped_at_end = {w: what for w, what in ended.items() if what}
        return self._done(report, t0)

    def _steps(
        self,
        pool: ThreadPoolExecutor,
        sop: Sop,
        values: Values,
        run_id: str,
        active: list[int],
        report: SopReport,
        holding: set[int],
    ) -> None:
        failed = False
        for step in sop.steps:
            if self.detach.is_set():
                report.interrupted = "detached" if holding else "interrupted"
                return  # Ctrl-C: no further step, not even an `always` one (the job, if any, goes on)
            if failed and not step.always:
                continue  # after a failure only `always` steps run (fetch the logs of a failed run)
            if not active:
                break
            if step.kind == "run" and len(active) > 1:
                env = self._env_hashes(pool, sop, step, values, run_id, active)
                check = consistency(report.steps, active, env)
                if check is not None:
                    self._add(report, check)
                    failed = True
                    continue
            sr = self._run_step(pool, sop, step, values, run_id, active)
            if step.kind == "run":
                holding.update(w for w, o in sr.outcomes.items() if "pid" in o.data)
                if sr.failed:
                    self._stop_started(pool, sr, step, sop, values, run_id, holding)
            self._add(report, sr)
            if sr.failed:
                if not self.keep_going or step.kind == "run":
                    failed = True
                else:
                    active = [w for w in active if w not in sr.failed]
        if self.detach.is_set():
            report.interrupted = "detached" if holding else "interrupted"

    def _add(self, report: SopReport, sr: StepReport) -> None:
        report.steps.append(sr)
        if self.on_step:
            self.on_step(sr)

    @staticmethod
    def _done(report: SopReport, t0: float) -> SopReport:
        report.duration_s = time.monotonic() - t0
        return report

    # -- the run lock and the checks before anything changes ----------------------------------------------
    def _check_actions(
        self, sop: Sop, w: int, n: int, run_id: str, values: dict[str, object]
    ) -> list[Action]:
        ctx = self._ctx(sop, w, n, run_id, values)
        return [a for step in sop.steps for a in step.check(ctx)]

    def _checks(
        self, pool: ThreadPoolExecutor, sop: Sop, values: Values, run_id: str, workers: list[int]
    ) -> StepReport | None:
        """Every step's read-only checks (the TPU's holders, the interpreter), before any step changes a
        worker. None when the SOP has none; a StepReport only worth showing when one failed."""
        n = len(self.transport.workers)
        steps = [s for s in sop.steps if s.check(self._ctx(sop, workers[0], n, run_id, values))]
        if not steps or not workers:
            return None
        t0 = time.monotonic()
        sr = StepReport(CHECKS_TITLE, "checks")

        def one(w: int) -> None:
            ctx = self._ctx(sop, w, n, run_id, values)
            outcome = Outcome("ok", "passed")
            try:
                for step in steps:
                    results = self._run_actions(w, step.check(ctx), threading.Event())
                    sr.results.setdefault(w, []).extend(results)
                    got = step.check_outcome(results)
                    if got.status in FAILED:
                        outcome = got
                        if isinstance(kind := got.data.get("error_kind"), str):
                            sr.error_kind[w] = kind  # a port no worker can reach is a connection failure (3)
                        break
            except TpuopsError as e:
                outcome = Outcome("failed", self.redact(e.line()))
                sr.error_kind[w] = e.kind
            sr.outcomes[w] = outcome

        list(pool.map(one, workers))
        sr.duration_s = time.monotonic() - t0
        return sr if sr.failed else None

    def _env_hashes(
        self, pool: ThreadPoolExecutor, sop: Sop, step: Step, values: Values, run_id: str, workers: list[int]
    ) -> dict[int, str]:
        """Each worker's own hash of the .env its job will source ("none" without one): drift between workers
        stops the run even when no sync_env step sent them the same file."""
        source = getattr(step, "source_env_file", None)
        if not source:
            return {}
        n = len(self.transport.workers)

        def one(w: int) -> tuple[int, str]:
            f = shell.path(self._ctx(sop, w, n, run_id, values).raw(source))
            script = f"if [ -f {f} ]; then sha256sum < {f} | cut -c1-12; else echo none; fi"
            try:
                r = self.transport.run(w, script, timeout=30)
            except TpuopsError:
                return w, "unknown"
            return w, r.stdout.strip() if r.ok else "unknown"

        return dict(pool.map(one, workers))

    def _run_step(
        self, pool: ThreadPoolExecutor, sop: Sop, step: Step, values: Values, run_id: str, workers: list[int]
    ) -> StepReport:
        t0 = time.monotonic()
        sr = StepReport(step.title, step.kind)
        cancel = _Either(threading.Event(), self.detach)  # another worker failed, or Ctrl-C
        n = len(self.transport.workers)

        def one(w: int) -> None:
            if self.on_phase:
                self.on_phase(w, step.title, step.kind, "begin")
            try:
                actions = step.plan(self._ctx(sop, w, n, run_id, values))
                doing = None
                if self.on_phase is not None:
                    on_phase = self.on_phase

                    def doing(what: str, w: int = w) -> None:
                        on_phase(w, step.title, step.kind, f"doing {self.redact(what)}")

                if claims(sop):  # only while this run holds the lock: after `tpuops stop` nothing starts
                    actions = [claim.guard(a, run_id, f"step {step.title} of run {run_id}") for a in actions]
                results = self._run_actions(w, actions, cancel, doing)
                lost = [r for r in results if r.exit_code == claim.LOST_EXIT and claim.LOST in r.stdout]
                outcome = step.outcome(results) if results or not actions else Outcome("ok")
                killed = outcome.status in FAILED and bool(results) and died_of_a_signal(results[-1])
                if claims(sop) and (lost or (killed and self._lost(w, run_id))):
                    what = lost[0].stderr.strip() if lost else "tpuops stop ended this step"
                    outcome = Outcome("failed", f"stopped: {what}", {"stopped": True})
                sr.results[w] = results
            except TpuopsError as e:
                outcome = Outcome("failed", self.redact(e.line()))
                sr.error_kind[w] = e.kind
            except Exception as e:
                outcome = Outcome("failed", self.redact(f"{type(e).__name__}: {e}"))
            sr.outcomes[w] = outcome
            if self.on_phase:
                self.on_phase(w, step.title, step.kind, str(outcome.status))
            if outcome.status in FAILED and not self.keep_going:
                cancel.set()

        list(pool.map(one, workers))
        sr.duration_s = time.monotonic() - t0
        return sr

    def _run_actions(
        self,
        w: int,
        actions: list[Action],
        cancel: threading.Event,
        doing: Callable[[str], None] | None = None,
    ) -> list[CmdResult]:
        results: list[CmdResult] = []
        for action in actions:
            if isinstance(action, Command):
                env = {**action.env, **self._secret_values(action.secret_env)}
                show: LineSink | None = self._show if action.stream and self.on_line else None
                if action.progress and doing is not None and show is None:
                    show = progress_sink(doing)
                r = self.transport.run(
                    w,
                    action.script,
                    env=env,
                    timeout=action.timeout,
                    cancel=cancel if action.cancellable else None,
                    on_line=show,
                )
                results.append(r)
                if not r.ok or SKIP_REST in r.stdout.splitlines():
                    break
            elif isinstance(action, Upload) and action.plain:
                self.transport.put_bytes(w, action.local.read_bytes(), action.remote, mode=action.mode)
                results.append(CmdResult(w, action.render(), 0))
            elif isinstance(action, Upload):
                loaded = secrets.load(action.local)
                self.redact.add(loaded.values.values())
                self.transport.put_bytes(w, secrets.serialize(loaded.values), action.remote, mode=action.mode)
                note = f"tpuops: fixed {' and '.join(loaded.fixes)}\n" if loaded.fixes else ""
                short = sorted(k for k, v in loaded.values.items() if 0 < len(v) < MIN_SECRET_CHARS)
                if short:  # said, never silently unredacted (the key names only)
                    note += (
                        f"tpuops: not redacted (under {MIN_SECRET_CHARS} characters): {', '.join(short)}\n"
                    )
                results.append(CmdResult(w, action.render(), 0, stdout=note))
            elif isinstance(action, Follow):
                results.append(self._follower().follow(w, action, cancel))
            elif isinstance(action, Fetch):
                results.append(self._follower().fetch(w, action, self.local_runs))
        return results

    def _follower(self) -> Follower:
        """Built at use: launch sets `abort` and `on_offset` after construction; `offsets` is shared."""
        return Follower(
            self.transport,
            redact=self.redact,
            on_line=self.on_line,
            on_event=self.on_event,
            offsets=self.offsets,
            on_offset=self.on_offset,
            abort=self.abort,
            detach=self.detach,
            reads=self.reads,
        )

    def _show(self, w: int, text: str) -> None:
        if self.on_line:
            self.on_line(w, self.redact(text))

    def _secret_values(self, names: tuple[str, ...]) -> dict[str, str]:
        if not names:
            return {}
        env = secrets.load(self.local_dir / ".env").values if (self.local_dir / ".env").exists() else {}
        missing = [n for n in names if n not in env]
        if missing:
            raise TpuopsError(f"the local .env has no {', '.join(missing)}", hint="add them to .env")
        self.redact.add(env[n] for n in names)
        return {n: env[n] for n in names}


class _Either(threading.Event):
    """Set when either event is: a step's own cancel (another worker failed) or the executor's detach. An Event
    (what the transports and the follower wait on) whose state is the two events'."""

    def __init__(self, own: threading.Event, outside: threading.Event) -> None:
        super().__init__()
        self.own, self.outside = own, outside

    def is_set(self) -> bool:
        return self.own.is_set() or self.outside.is_set()

    def set(self) -> None:
        self.own.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.own.wait(timeout) or self.outside.is_set()
