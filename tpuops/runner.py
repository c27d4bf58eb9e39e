"""The library call behind `tpuops sop run` and its aliases: validate everything, then plan or execute."""

from __future__ import annotations

import json
import secrets as _secrets
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tpuops import config as user_config
from tpuops.errors import ConnectError, ExitCode, TpuopsError
from tpuops.shell import Redactor
from tpuops.sop import loader
from tpuops.sop.executor import Executor, Plan, SopReport, StepReport
from tpuops.targets import TargetSpec, open_transport, select_workers
from tpuops.transport.base import LineSink

DRY_RUN_ID = "DRY-RUN"


@dataclass(frozen=True)
class RunRequest:
    sop: str
    sets: dict[str, str] = field(default_factory=dict)
    target: TargetSpec = field(default_factory=TargetSpec)
    worker: str = "all"
    dry_run: bool = False
    force: bool = False
    keep_going: bool = False
    parallel: int | None = None
    run_id: str | None = None


@dataclass
class DryRun:
    sop: str
    transport: str
    workers: list[int]
    values: dict[str, object]
    plan: Plan


def new_run_id(sop: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{sop}-{_secrets.token_hex(2)}"


def run(
    req: RunRequest,
    *,
    on_line: LineSink | None = None,
    on_step: Callable[[StepReport], None] | None = None,
    cwd: Path | None = None,
) -> SopReport | DryRun:
    """Load and validate the SOP and every value first; only then touch a worker."""
    cwd = cwd or Path.cwd()
    cfg = user_config.load(cwd)
    sop = loader.load(loader.find(req.sop))
    target = req.target.with_defaults(cfg)
    defaults = {**_context_defaults(sop.params, target, cwd), **cfg.params}
    values = sop.resolve(req.sets, defaults)
    redact = Redactor()
    transport = open_transport(target, redact)
    workers = select_workers(req.worker, len(transport.workers))
    executor = Executor(
        transport,
        parallel=req.parallel or cfg.parallel,
        keep_going=req.keep_going,
        force=req.force,
        local_dir=cwd,
        local_runs=user_config.state_home() / "runs",
        redact=redact,
        on_line=on_line,
        on_step=on_step,
    )
    if req.dry_run:
        plan = executor.plan(sop, values, DRY_RUN_ID, workers)
        return DryRun(sop.name, transport.name, workers, values, plan)
    run_id = req.run_id or new_run_id(sop.name)
    _record(run_id, sop.name, target, workers, values)
    try:
        _connect_all(transport, workers, executor.parallel)
        return executor.execute(sop, values, run_id, workers)
    finally:
        transport.close()


def exit_code(report: SopReport) -> ExitCode:
    """The process exit code for a finished SOP (see README: Exit codes)."""
    failure = report.first_failure()
    if failure is None:
        return ExitCode.OK
    step, worker, outcome = failure
    kind = step.error_kind.get(worker)
    if kind in {"connect", "host_key"}:
        return ExitCode.CONNECT
    return {"busy": ExitCode.TPU_BUSY, "timeout": ExitCode.TIMEOUT}.get(outcome.status, ExitCode.FAILED)


def _connect_all(transport, workers: list[int], parallel: int) -> None:  # noqa: ANN001
    """Open every connection up front, in parallel: a host-key or login problem stops before any step."""
    from concurrent.futures import ThreadPoolExecutor

    errors: list[TpuopsError] = []

    def one(w: int) -> None:
        try:
            transport.connect(w)
        except TpuopsError as e:
            errors.append(e)

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(workers)))) as pool:
        list(pool.map(one, workers))
    if errors:
        first = sorted(errors, key=lambda e: e.kind != "host_key")[0]
        if len(errors) > 1 and isinstance(first, ConnectError):
            first.message += f" (and {len(errors) - 1} more worker(s) failed to connect)"
        raise first


def _context_defaults(params: dict, target: TargetSpec, cwd: Path) -> dict[str, object]:
    """Defaults taken from where tpuops runs: the repository to sync is this checkout (locally, its path)."""
    found: dict[str, object] = {}
    if "repo_url" in params and target.kind == "local":
        top = _git(cwd, "rev-parse", "--show-toplevel")
        if top:
            found["repo_url"] = top
    if "repo_url" in params and target.kind != "local":
        url = _git(cwd, "remote", "get-url", "origin")
        if url:
            found["repo_url"] = url
    return found


def _git(cwd: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=10)  # noqa: S603, S607
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _record(run_id: str, sop: str, target: TargetSpec, workers: list[int], values: dict) -> None:
    """Remember how to reach a run again (`tpuops runs`, attach, logs); holds no secret."""
    d = user_config.state_home() / "runs" / run_id
    d.mkdir(parents=True, exist_ok=True)
    record = {
        "run_id": run_id,
        "sop": sop,
        "target": {k: v for k, v in target.__dict__.items() if k != "extra"},
        "workers": workers,
        "values": {k: v for k, v in values.items()},
        "started": time.time(),
    }
    (d / "run.json").write_text(json.dumps(record, indent=1, default=str))
