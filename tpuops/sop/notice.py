"""The job's preemption notice: the `preemption_notice` setting of a `run` step, and the shell that starts the
watcher (sop/notice_watch.py) beside the job on each worker and notes a notice in the job's exit file."""

from __future__ import annotations

from importlib import resources

from tpuops import shell
from tpuops.logs.events import NOTICE

MODES = ("signal", "file", "off")
ENV = "TPUOPS_NOTICE_FILE"  # the job's environment: where the notice appears (docs/reliability.md)
WATCHER = "notice-watch.py"  # in the run directory


def mode(value: str | None) -> str:
    """The setting, checked: signal (the notice file, then SIGTERM to the job), file (the file only), off."""
    chosen = (value or "off").strip().lower()
    if chosen not in MODES:
        raise ValueError(f"preemption_notice must be one of {', '.join(MODES)}, received {value!r}")
    return chosen


def notice_file(worker: int) -> str:
    return f'"$rd"/worker-{worker}.notice'


def install(chosen: str) -> str:
    """Start-script lines (run dir `$rd` made): the watcher written beside the job's log, its file exported."""
    if chosen == "off":
        return ""
    source = resources.files("tpuops.sop").joinpath("notice_watch.py").read_text()
    return (
        f"cat > \"$rd\"/{WATCHER} <<'TPUOPS_NOTICE_WATCH'\n{source.rstrip()}\nTPUOPS_NOTICE_WATCH\n"
        f'export {ENV}="$rd/worker-$k.notice"\n'
    )


def job_start(chosen: str, worker: int) -> str:
    """The job's shell, before the job: the watcher in the background (no python3 on the worker: no watcher, as
    its log says), in the job's process group so `tpuops stop` ends it with the job."""
    if chosen == "off":
        return ""
    log = f'"$rd"/worker-{worker}.notice.log'
    return (
        f'w=\'\'; if p3=$(command -v python3); then "$p3" "$rd"/{WATCHER} {shell.quote(chosen)} '
        f"{notice_file(worker)} >> {log} 2>&1 & w=$!; "
        f"else echo 'no python3 on this worker: no preemption-notice watcher' >> {log}; fi; "
    )


def job_end(chosen: str, worker: int) -> str:
    """The job's shell, after the job: the watcher stopped, a notice it gave kept as the exit file's note."""
    if chosen == "off":
        return ""
    return f'[ -n "$w" ] && kill $w 2>/dev/null; [ -e {notice_file(worker)} ] && note="$note {NOTICE}"; '
