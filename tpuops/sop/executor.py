"""The one executor: runs a SOP's steps over a transport on all selected workers in parallel."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuops import shell
from tpuops.errors import TpuopsError, error_class
from tpuops.logs.events import Event
from tpuops.logs.follow import Follower
from tpuops.shell import MIN_SECRET_CHARS, Redactor
from tpuops.sop import secrets
from tpuops.sop.actions import Action, Command, Fetch, Follow, Upload
from tpuops.sop.loader import Sop
from tpuops.sop.model import Outcome, PlanContext, Step
from tpuops.sop.status import FAILED
from tpuops.transport.base import CmdResult, LineSink, Transport

SKIP_REST = "tpuops: same"  # a check command printing this makes the rest of the step unnecessary

Plan = list[tuple[str, dict[int, list[Action]]]]


@dataclass
class StepReport:
    title: str
    kind: str
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    results: dict[int, list[CmdResult]] = field(default_factory=dict)
    duration_s: float = 0.0
    error_kind: dict[int, str] = field(default_factory=dict)  # worker -> TpuopsError.kind

    @property
    def failed(self) -> dict[int, Outcome]:
        return {w: o for w, o in sorted(self.outcomes.items()) if o.status in FAILED}


@dataclass
class SopReport:
    sop: str
    run_id: str
    transport: str
    workers: list[int]
    steps: list[StepReport] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(not s.failed for s in self.steps)

    def to_dict(self, code: int) -> dict[str, Any]:
        """The steps' part of the --json report (run/launch's RunResult adds the log, hint and recoveries);
        holds no secret: details are redacted."""
        failure = self.first_failure()
        return {
            "sop": self.sop,
            "run_id": self.run_id,
            "transport": self.transport,
            "workers": self.workers,
            "ok": code == 0,
            "exit_code": code,
            "failure": None
            if failure is None
            else {
                "step": failure[0].title,
                "worker": failure[1],
                "status": failure[2].status,
                "detail": failure[2].detail,
            },
            "duration_s": round(self.duration_s, 3),
            "steps": [
                {
                    "title": s.title,
                    "kind": s.kind,
                    "duration_s": round(s.duration_s, 3),
                    "workers": {
                        str(w): {"status": o.status, "detail": o.detail, **o.data}
                        for w, o in sorted(s.outcomes.items())
                    },
                }
                for s in self.steps
            ],
            "error_class": error_class(code),
        }

    def first_failure(self) -> tuple[StepReport, int, Outcome] | None:
        for s in self.steps:
            for w, o in s.failed.items():
                if o.status != "cancelled":
                    return s, w, o
        return None


@dataclass
class Executor:
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
    seen: dict[int, dict[int, float]] = field(default_factory=dict)  # Follower.seen, shared as offsets is
    on_offset: Callable[[dict[int, int]], None] | None = None
    abort: threading.Event = field(default_factory=threading.Event)  # set from outside: stop following now

    def plan(self, sop: Sop, values: dict[str, object], run_id: str, workers: list[int]) -> Plan:
        n = len(self.transport.workers)
        return [
            (step.title, {w: step.plan(self._ctx(sop, w, n, run_id, values)) for w in workers})
            for step in sop.steps
        ]

    def _ctx(self, sop: Sop, worker: int, n: int, run_id: str, values: dict[str, object]) -> PlanContext:
        paths = frozenset(k for k, p in sop.params.items() if p.type == "path")
        first = self.transport.workers[0]
        coordinator = first.internal_host or (first.host if first.host != "localhost" else "127.0.0.1")
        return PlanContext(worker, n, run_id, values, self.force, self.local_dir, paths, coordinator)

    def execute(self, sop: Sop, values: dict[str, object], run_id: str, workers: list[int]) -> SopReport:
        t0 = time.monotonic()
        report = SopReport(sop.name, run_id, self.transport.name, list(workers))
        active = list(workers)
        with ThreadPoolExecutor(max_workers=max(1, min(self.parallel, len(workers)))) as pool:
            failed = False
            for step in sop.steps:
                if failed and not step.always:
                    continue  # after a failure only `always` steps run (fetch the logs of a failed run)
                if not active:
                    break
                if step.kind == "run" and len(active) > 1:
                    env = self._env_hashes(pool, sop, step, values, run_id, active)
                    check = consistency(report.steps, active, env)
                    if check is not None:
                        report.steps.append(check)
                        if self.on_step:
                            self.on_step(check)
                        failed = True
                        continue
                sr = self._run_step(pool, sop, step, values, run_id, active)
                report.steps.append(sr)
                if self.on_step:
                    self.on_step(sr)
                if sr.failed:
                    if not self.keep_going:
                        failed = True
                    else:
                        active = [w for w in active if w not in sr.failed]
        report.duration_s = time.monotonic() - t0
        return report

    def _env_hashes(
        self, pool: ThreadPoolExecutor, sop: Sop, step: Step, values: dict, run_id: str, workers: list[int]
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
        self, pool: ThreadPoolExecutor, sop: Sop, step: Step, values: dict, run_id: str, workers: list[int]
    ) -> StepReport:
        t0 = time.monotonic()
        sr = StepReport(step.title, step.kind)
        cancel = threading.Event()
        n = len(self.transport.workers)

        def one(w: int) -> None:
            if self.on_phase:
                self.on_phase(w, step.title, step.kind, "begin")
            try:
                actions = step.plan(self._ctx(sop, w, n, run_id, values))
                results = self._run_actions(w, actions, cancel)
                outcome = step.outcome(results) if results or not actions else Outcome("ok")
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

    def _run_actions(self, w: int, actions: list[Action], cancel: threading.Event) -> list[CmdResult]:
        results: list[CmdResult] = []
        for action in actions:
            if isinstance(action, Command):
                env = {**action.env, **self._secret_values(action.secret_env)}
                show = self._show if action.stream and self.on_line else None
                r = self.transport.run(
                    w, action.script, env=env, timeout=action.timeout, cancel=cancel, on_line=show
                )
                results.append(r)
                if not r.ok or SKIP_REST in r.stdout.splitlines():
                    break
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
            seen=self.seen,
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


CONSISTENT = ("sha", "versions", "env_sha")  # what must be identical on every worker before a run starts


def consistency(
    steps: list[StepReport], workers: list[int], env: dict[int, str] | None = None
) -> StepReport | None:
    """Refuse to start a multi-worker run when workers differ in code, .env or Python/JAX versions.

    `env`: each worker's own .env hash as read just now (it wins over what earlier steps reported).
    """
    seen: dict[int, dict[str, object]] = {w: {} for w in workers}
    for s in steps:
        for w, o in s.outcomes.items():
            if w in seen:
                seen[w].update({k: o.data[k] for k in CONSISTENT if k in o.data})
    for w, digest in (env or {}).items():
        if w in seen:
            seen[w]["env_sha"] = digest
    diffs: dict[int, list[str]] = {w: [] for w in workers}
    for key in CONSISTENT:
        values = {w: d.get(key) for w, d in seen.items() if key in d}
        if len({repr(v) for v in values.values()}) > 1:
            ref = values[min(values)]
            for w, v in values.items():
                if v != ref:
                    diffs[w].append(f"{key} {_short(v)} (w{min(values)} has {_short(ref)})")
    if not any(diffs.values()):
        return None
    sr = StepReport("preflight consistency", "preflight")
    for w in workers:
        sr.outcomes[w] = Outcome("failed", "; ".join(diffs[w])) if diffs[w] else Outcome("ok", "matches w0")
    return sr


def _short(v: object) -> str:
    if isinstance(v, dict):
        return " ".join(f"{k}={x}" for k, x in v.items())
    return str(v)
