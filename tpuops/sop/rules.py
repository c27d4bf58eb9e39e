"""The executor's rules read from results alone: which steps take the run lock, what a claim's answer means,
whether the workers agree before a job starts, whether a command died of a signal."""

from __future__ import annotations

from tpuops.sop.loader import Sop
from tpuops.sop.model import Outcome, Step, markers
from tpuops.sop.reports import StepReport
from tpuops.transport.base import CmdResult, Kind

LOCK_TITLE = "run lock"
CHECKS_TITLE = "checks"
# Steps that change what a run uses: a SOP with one takes the run lock on every worker first.
CLAIMING = frozenset({"git_sync", "python_env", "clear_lockfile", "sync_env", "run"})


def died_of_a_signal(r: CmdResult) -> bool:
    """A command that died of a signal on its worker (as `tpuops stop` ends a step): over SSH no exit status
    (255, with the transport's words), here a negative return code, or a shell's 128+SIGTERM/SIGKILL."""
    return r.kind is Kind.EXIT and (
        r.exit_code < 0 or r.exit_code in (143, 137) or "killed on the worker" in (r.error or "")
    )


def claims(sop: Sop) -> bool:
    return any(step.kind in CLAIMING for step in sop.steps)


def claim_outcome(r: CmdResult) -> Outcome:
    """The claim script's result on one worker, as the report shows it."""
    from tpuops.sop.steps import BUSY_EXIT

    found = markers(r.stdout)
    if r.kind is Kind.EXIT and r.exit_code == BUSY_EXIT:
        who = ", ".join(f"run {m['run']} (pid {m['pid']})" for m in found if m["_"].startswith("active"))
        return Outcome("busy", f"{who} is active on this worker (use --force to stop it)", {"active": who})
    if not r.ok:
        if "No space left on device" in r.stderr:
            return Outcome("failed", "no space left on device for the run lock in the home directory")
        return Step.model_construct(kind="lock").outcome([r])
    stopped = [f"run {m['run']} (pid {m['pid']})" for m in found if m["_"].startswith("stopped run=")]
    steps = [m["_"].removeprefix("stopped ") for m in found if m["_"].startswith("stopped step ")]
    also = "".join(f"; stopped {s}, which it had left running" for s in steps)
    stale = [
        f"{m['run']} ({STALE.get(m.get('why', ''), 'its holder is gone')})"
        for m in found
        if m["_"].startswith("stale")
    ]
    if stopped:
        return Outcome("changed", f"stopped {', '.join(stopped)}{also}; lock taken", {"stopped": stopped})
    if stale:
        return Outcome("changed", f"took over the stale lock of run {', '.join(stale)}{also}")
    return Outcome("ok", "lock taken")


STALE = {  # why a lock's holder is gone (sop/claim.py's claim script says which)
    "gone": "its holder is gone",
    "reused": "its pid now belongs to another process, left as it is",
    "reboot": "taken before the worker rebooted",
}


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


def start_refused(sr: StepReport, w: int) -> bool:
    """The start script's own failure (exit 1, having started nothing or stopped what it started), not a start
    that ended without its answer."""
    results = sr.results.get(w) or []
    return bool(results) and results[-1].kind is Kind.EXIT and results[-1].exit_code == 1
