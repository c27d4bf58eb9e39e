"""The executor's run lock on the workers: claimed before anything changes (first worker first), given back when
the SOP holds no job, asked after a step that died of a signal (did `tpuops stop` end it?), and the jobs of a start
that failed somewhere stopped (all or none). A mixin of Executor: it uses the executor's transport and actions."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tpuops import shell
from tpuops.errors import TpuopsError
from tpuops.shell import Redactor
from tpuops.sop import claim
from tpuops.sop.actions import Action, Command
from tpuops.sop.loader import Sop
from tpuops.sop.model import Outcome, PlanContext, Step, Values, markers
from tpuops.sop.reports import StepReport
from tpuops.sop.rules import LOCK_TITLE, claim_outcome, start_refused
from tpuops.sop.status import FAILED
from tpuops.transport.base import CmdResult, Transport


class RunLock:
    """The run-lock half of Executor (sop/executor.py), which provides what is declared here."""

    transport: Transport
    redact: Redactor
    force: bool

    def _ctx(self, sop: Sop, worker: int, n: int, run_id: str, values: dict[str, object]) -> PlanContext:
        raise NotImplementedError

    def _run_actions(
        self,
        w: int,
        actions: list[Action],
        cancel: threading.Event,
        doing: Callable[[str], None] | None = None,
    ) -> list[CmdResult]:
        raise NotImplementedError

    def _claim_command(self, sop: Sop, w: int, n: int, run_id: str, values: dict[str, object]) -> Command:
        from tpuops.sop.runs import Run, run_dir

        ctx = self._ctx(sop, w, n, run_id, values)
        run = next((s for s in sop.steps if isinstance(s, Run)), None)
        runs = ctx.raw(run.runs_dir) if run else str(values.get("runs_dir", "~/tpuops/runs"))
        script = claim.claim_script(
            run_id, shell.path(run_dir(runs, run_id)), shell.path(runs), w, force=self.force
        )
        what = f"take the run lock ~/.tpuops-run.lock for run {run_id}" + (
            " (--force: stop its holder)" if self.force else ""
        )
        return Command(script, timeout=60, cancellable=False, what=what)

    def _claim(
        self, pool: ThreadPoolExecutor, sop: Sop, values: Values, run_id: str, workers: list[int]
    ) -> StepReport:
        """The lock on the first worker, then on the others: of two runs started at once, the one that gets
        the first worker's lock is the one that starts; the other is refused there, before it takes any."""
        t0 = time.monotonic()
        sr = StepReport(LOCK_TITLE, "lock")
        n = len(self.transport.workers)

        def one(w: int) -> None:
            try:
                r = self._run_actions(w, [self._claim_command(sop, w, n, run_id, values)], threading.Event())
                sr.results[w] = r
                sr.outcomes[w] = claim_outcome(r[-1])
            except TpuopsError as e:
                sr.outcomes[w] = Outcome("failed", self.redact(e.line()))
                sr.error_kind[w] = e.kind

        first, rest = workers[0], workers[1:]
        one(first)
        if sr.outcomes[first].status in FAILED:
            for w in rest:
                sr.outcomes[w] = Outcome("skipped", f"not tried: refused on w{first}")
        else:
            list(pool.map(one, rest))
        sr.duration_s = time.monotonic() - t0
        return sr

    def _lost(self, w: int, run_id: str) -> bool:
        """Whether the run lost the worker's lock (`tpuops stop`): asked after a step failed there."""
        try:
            return claim.LOST in self.transport.run(w, claim.lost_script(run_id), timeout=30).stdout
        except TpuopsError:
            return False

    def _release(self, w: int, run_id: str) -> str | None:
        """The lock given back; what of the run it had to stop there (a step still running), if anything."""
        try:
            r = self.transport.run(w, claim.release_script(run_id, w), timeout=30)
        except TpuopsError:
            return None  # unreachable now: the lock's stand-in holder ends by itself (CLAIM_TTL_S), or `tpuops stop`
        return next(
            (m["_"].removeprefix("stopped ") for m in markers(r.stdout) if m["_"].startswith("stopped step")),
            None,
        )

    def _stop_started(
        self,
        pool: ThreadPoolExecutor,
        sr: StepReport,
        step: Step,
        sop: Sop,
        values: Values,
        run_id: str,
        holding: set[int],
    ) -> None:
        """All or none: the start failed on some worker, so the jobs it started on the others are stopped
        (SIGTERM to the process group, SIGKILL after 10 s) and their locks given back. So is a job on a
        worker whose start ended without its answer (a lost connection, a killed shell, a timeout): it may
        have started there."""
        from tpuops.sop.runs import run_dir

        n = len(self.transport.workers)
        bad = ", ".join(f"w{w}" for w, o in sr.outcomes.items() if o.status in FAILED)
        unsure = {w for w, o in sr.outcomes.items() if o.status in FAILED and not start_refused(sr, w)}

        def one(w: int) -> None:
            ctx = self._ctx(sop, w, n, run_id, values)
            rd = shell.path(run_dir(ctx.raw(getattr(step, "runs_dir", "~/tpuops/runs")), run_id))
            try:
                r = self.transport.run(w, claim.stop_started_script(run_id, rd, w), timeout=60)
            except TpuopsError:
                r = None
            ok = r is not None and r.ok
            if w in unsure:
                was = sr.outcomes[w]
                said = markers(r.stdout) if r is not None and ok else []
                stopped = [m["pid"] for m in said if m["_"].startswith("stopped")]
                end = (
                    f"its job had started (pid {stopped[0]}) and was stopped"
                    if stopped
                    else "no job of it runs there"
                    if ok
                    else f"whether its job started there is unknown: tpuops stop {run_id}"
                )
                sr.outcomes[w] = Outcome(was.status, f"{was.detail}; {end}", was.data)
                return
            pid = sr.outcomes[w].data["pid"]
            if ok:
                detail = f"started pid {pid}, then stopped: the start failed on {bad}"
                sr.outcomes[w] = Outcome("cancelled", detail, {"pid": pid, "stopped": True})
                holding.discard(w)
            else:
                detail = f"started pid {pid}; the start failed on {bad} and stopping it failed: tpuops stop {run_id}"
                sr.outcomes[w] = Outcome("failed", detail, {"pid": pid})

        list(pool.map(one, sorted(holding | unsure)))
