"""Logs on disk into one LogReport: a log file, a run directory's worker logs with their exit files, a run id.

`tpuops report` reads logs here; a run that was followed does not: its report comes from the scanners its
follower fed (logs/follow.Readings), finished by `run_report` as a read of its run directory would be."""

from __future__ import annotations

import json
from pathlib import Path

# The reader and what it hands out, under the names report and launch code reach for.
from tpuops.logs.events import LogReport, apply_exit, exit_status, merge
from tpuops.logs.lines import WORKER_LOG
from tpuops.logs.scanner import LogScanner

__all__ = [
    "LogReport", "LogScanner", "apply_exit", "merge", "read_exit", "run_logs", "run_report", "scan_file", "scan_run",
    "scan_target",
]  # fmt: skip


def scan_file(
    path: str | Path,
    warmup: int = 1,
    *,
    worker: int | None = None,
    check_exit: bool | None = None,
    step_pattern: str | None = None,
) -> LogReport:
    """Scan one log in 4 MiB chunks. For `worker-<k>.log` the `worker-<k>.exit` beside it is the exit code.
    `step_pattern`: the user's step-line regex instead of the common forms (LogScanner)."""
    path = Path(path)
    named = WORKER_LOG.match(path.name)
    k = worker if worker is not None else int(named["k"]) if named else 0
    scanner = LogScanner(warmup, k, str(path), step_pattern=step_pattern, seen=_seen(path))
    with path.open("rb") as f:
        while data := f.read(1 << 22):
            scanner.feed_bytes(data)
    report = scanner.close()
    if check_exit if check_exit is not None else bool(named):
        apply_exit(report, k, read_exit(path.with_suffix(".exit")))
    return report


def _seen(log: Path) -> dict[int, float] | None:
    """When the follower saw each step line that printed no duration (`worker-<k>.seen.json`), if it kept it."""
    import json

    try:
        return {int(k): float(v) for k, v in json.loads(log.with_suffix(".seen.json").read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return None


def read_exit(path: Path) -> int | None:
    try:
        return exit_status(path.read_bytes())[0]
    except OSError:
        return None


def run_logs(run_dir: Path) -> list[Path]:
    logs = [p for p in run_dir.glob("worker-*.log") if WORKER_LOG.match(p.name)]
    return sorted(logs, key=lambda p: int(WORKER_LOG.match(p.name)["k"]))  # type: ignore[index]


def scan_run(
    run_dir: Path, warmup: int = 1, *, check_exit: bool = True, step_pattern: str | None = None
) -> LogReport:
    """Every `worker-<k>.log` of a run directory (with its `worker-<k>.exit` unless told not to), merged."""
    reports = [
        scan_file(p, warmup, check_exit=check_exit, step_pattern=step_pattern) for p in run_logs(run_dir)
    ]
    return run_report(merge(reports) if reports else None, run_dir)


def run_report(report: LogReport | None, run_dir: Path) -> LogReport:
    """A run's merged worker reports as the report of its local run directory: named after it, with the
    trainer's full config fetched beside the logs. None (no worker's log was read) is exit 2."""
    if report is None:
        from tpuops.errors import UsageError

        raise UsageError(
            f"no worker-*.log in {run_dir}", hint="fetch the run's logs first, or pass a log file"
        )
    report.source = str(run_dir)
    try:  # the columns the run was started with (`--set columns=...`): its steps table shows those
        chosen = json.loads((run_dir / "run.json").read_text()).get("values", {}).get("columns")
    except (OSError, ValueError, AttributeError):
        chosen = None
    if isinstance(chosen, list) and all(isinstance(c, str) for c in chosen):
        report.columns = report.columns or chosen or None
    full = run_dir / "config.json"  # the trainer's resolved config, fetched beside the logs
    if report.config is None and full.is_file():
        try:
            report.config = json.loads(full.read_text())
        except (OSError, ValueError):
            pass  # a config that cannot be read is no reason to lose the report
    return report


def scan_target(
    target: str, warmup: int = 1, runs_home: Path | None = None, *, step_pattern: str | None = None
) -> LogReport:
    """LOGFILE, a run directory, or a RUN_ID under `<state home>/runs/`."""
    path = Path(target).expanduser()
    if path.is_file():
        return scan_file(path, warmup, step_pattern=step_pattern)
    if path.is_dir():
        return scan_run(path, warmup, step_pattern=step_pattern)
    if runs_home is None:
        from tpuops.config import state_home

        runs_home = state_home() / "runs"
    if (runs_home / target).is_dir():
        return scan_run(runs_home / target, warmup, step_pattern=step_pattern)
    from tpuops.errors import UsageError

    raise UsageError(f"{target!r} is neither a log file nor a run in {runs_home}", hint="see `tpuops runs`")
