"""`tpuops report`: a log file, a run folder or a RUN_ID, judged as the run itself is (run/finish); a RUN_ID's logs
are fetched from its workers first when this machine lacks them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from tpuops import config as user_config
from tpuops.errors import ExitCode, TpuopsError, UsageError
from tpuops.logs.follow import Follower
from tpuops.run import finish
from tpuops.run.detached import learn_sent_env
from tpuops.run.logreport import Reviewed
from tpuops.run.store import load
from tpuops.run.target import reach_again
from tpuops.sop.actions import Fetch


def fetch(run_id: str, *, notice: Callable[[str], None] | None = None) -> Path:
    """A run's logs copied here from its workers (redacted, with their exit files), when this machine lacks a
    worker's log or the run had not ended when they were last copied; its local run folder. `tpuops report
    RUN_ID` reads them from there. A worker that cannot be read keeps its last local copy; with none, the
    error says which worker could not be read and why (exit 3, or 2 when the VM is gone)."""
    rec = load(run_id)
    have = all((rec.local_dir / f"worker-{w}.log").is_file() for w in rec.workers)
    if have and rec.result is not None:
        return rec.local_dir
    redact = rec.redactor()
    why: dict[int, str] = {}
    try:
        _, transport = reach_again(rec.spec(), rec.route, rec.workers, redact)
    except TpuopsError as e:
        if have:
            _say(
                notice,
                f"run {run_id}: its workers could not be reached ({e.line()}): the local copies are read",
            )
            return rec.local_dir
        raise type(e)(f"no local copy of run {run_id}'s logs, and its workers could not be reached: {e.message}",
                      hint=e.hint) from None  # fmt: skip
    try:
        learn_sent_env(rec, transport, redact)
        follower = Follower(transport, redact=redact)
        for w in rec.workers:
            try:
                r = follower.fetch(w, Fetch(rec.remote_dir), user_config.state_home() / "runs")
            except (OSError, EOFError, TpuopsError) as e:
                why[w] = e.line() if isinstance(e, TpuopsError) else str(e) or type(e).__name__
                continue
            if not r.ok:
                why[w] = r.stderr.strip() or r.error or f"exit {r.exit_code}"
    finally:
        transport.close()
    got = [w for w in rec.workers if w not in why]
    if got:
        _say(
            notice, f"fetched the logs of {', '.join(f'w{w}' for w in got)} of run {run_id} from its workers"
        )
    missing = [w for w in rec.workers if not (rec.local_dir / f"worker-{w}.log").is_file()]
    if missing and len(missing) == len(rec.workers):
        first = missing[0]
        raise UsageError(
            f"no log of run {run_id} here or on its workers: w{first}: {why.get(first, 'not found')}",
            hint="a run that failed before its job started has no log: `tpuops runs` says how it ended",
        )
    return rec.local_dir


def review(
    target: str,
    warmup: int,
    baseline: Path | None,
    threshold: float,
    html: Path | None,
    step_pattern: str | None = None,
    columns: str | None = None,
    *,
    notice: Callable[[str], None] | None = None,
) -> tuple[Reviewed, str | None]:
    """`tpuops report`: a log file, a run folder, or a RUN_ID (its logs fetched from the workers first when this
    machine lacks them: `fetch`), judged as `attach` judges it (run/finish.judge: a stopped run is exit 14);
    the review and what to try next."""
    from tpuops.run import logreport

    path = Path(target).expanduser()
    rec = None
    if not path.exists() and (user_config.state_home() / "runs" / target / "run.json").is_file():
        rec = load(target)
        fetch(target, notice=notice)
    r = logreport.review(target, warmup, baseline, threshold, html, step_pattern, columns)
    if rec is None and not path.is_dir():
        return r, None  # a log file: its own lines are all there is to judge
    if rec is None and (path / "run.json").is_file():  # a run's own folder: judged by its own record
        rec = load(path.name) if (user_config.state_home() / "runs" / path.name) == path.resolve() else None
    config, accelerator = finish.named(rec.values, rec.estimate) if rec else (None, None)
    # A hang is seen by a follow, not in a log: the run's (or an attach's) recorded verdict says so. A stop that
    # came after it (the usual way to end a hung job) leaves it a hang.
    hung = rec is not None and rec.result is not None and rec.result.get("exit_code") == ExitCode.HANG
    verdict = finish.judge(
        r.report,
        stopped=() if hung else finish.stopped_workers(rec.local_dir if rec else path),
        hung=hung,
        deltas=r.deltas,
        fail_on_recompile=bool(rec.scan and rec.scan.get("fail_on_recompile")) if rec else False,
        config=config,
        accelerator=accelerator,
    )
    return dataclasses.replace(r, code=int(verdict.code)), verdict.hint


def _say(notice: Callable[[str], None] | None, line: str) -> None:
    if notice is not None:
        notice(line)
