"""The library call behind `tpuops sop run` and its aliases: validate everything, then plan or execute."""

from __future__ import annotations

import json
import secrets as _secrets
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tpuops import config as user_config
from tpuops.config import TargetSpec, UserConfig, write_atomic
from tpuops.errors import ExitCode, TpuopsError, UsageError
from tpuops.run.target import Target, connect_all, open_transport, resolve, select_workers
from tpuops.shell import Redactor
from tpuops.sop import loader
from tpuops.sop.executor import Executor, Plan, SopReport, StepReport
from tpuops.sop.model import TEMPLATE, PlanContext
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
    skip_fit: bool = False  # --skip-fit: start without the ahead-of-time fit check


@dataclass
class DryRun:
    sop: str
    transport: str
    workers: list[int]
    values: dict[str, object]
    plan: Plan
    fit: str | None = None  # the fit preflight's verdict line
    target: Target | None = None  # what was resolved: a later run of the same request may reuse it


def new_run_id(sop: str) -> str:
    """A unique run id named after the SOP (a SOP given as a file path counts by its file name: the id is
    also a folder name, here and on the workers)."""
    name = Path(sop).stem if sop.endswith((".yaml", ".yml")) else sop
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{name}-{_secrets.token_hex(2)}"


@dataclass(frozen=True)
class _Checked:
    """A SOP and its values after every local check: what each attempt of the run executes."""

    sop: loader.Sop
    values: dict[str, object]


def start(
    req: RunRequest,
    *,
    max_recoveries: int | None = None,
    unreachable_s: float | None = None,
    watch_s: float = 10.0,
    ready_timeout: float = 1800.0,
    on_line: LineSink | None = None,
    on_step: Callable[[StepReport], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    notify: Callable[[str], None] | None = None,
    cwd: Path | None = None,
) -> SopReport | DryRun:
    """The library call behind every SOP command: the config loaded once, the SOP and its values checked,
    the target resolved once, then the plan (--dry-run) or the run. On a VM the run is always watched through
    the TPU API: a lost VM ends it at once (exit 8), or with `max_recoveries` (--recover) is recreated and the
    SOP runs again (see `recover.watched`). `notify` hears the TPU API's retries; `on_event` tpuops' events."""
    from tpuops.run import recover

    cwd = cwd or Path.cwd()
    cfg = user_config.load(cwd)
    spec = req.target.with_defaults(cfg)  # the VM may come from tpuops.toml
    watched = not req.dry_run and (max_recoveries is not None or spec.kind == "vm")
    if watched and spec.kind != "vm":
        raise UsageError("--recover needs --vm: only a VM can be watched and recreated")
    checked = _check(req, spec, cfg, cwd)
    if watched and max_recoveries and checked.sop.overrides and on_event:  # a trainer SOP: can it resume?
        for warning in recover.checkpoint_warnings(req.sets):
            on_event(warning)
    target = resolve(spec, cfg, notify)
    if not watched:
        return _execute(req, checked, target, on_line=on_line, on_step=on_step, cwd=cwd)

    def attempt(run_id: str, now: Target, abort: threading.Event, lines: LineSink) -> SopReport:
        report = _execute(
            replace(req, run_id=run_id), checked, now, on_line=lines, on_step=on_step, cwd=cwd, abort=abort
        )
        assert isinstance(report, SopReport)  # not a dry run
        return report

    return recover.watched(
        target,
        attempt,
        base_id=req.run_id or new_run_id(req.sop),
        sop=req.sop,
        max_recoveries=max_recoveries or 0,
        watch_s=watch_s,
        unreachable_s=cfg.unreachable_s if unreachable_s is None else unreachable_s,
        ready_timeout=ready_timeout,
        on_line=on_line,
        on_event=on_event,
        notify=notify,
    )


def run(
    req: RunRequest,
    *,
    on_line: LineSink | None = None,
    on_step: Callable[[StepReport], None] | None = None,
    cwd: Path | None = None,
    abort: threading.Event | None = None,
    target: Target | None = None,
) -> SopReport | DryRun:
    """One run without the VM watch (`start` adds it): load and validate the SOP and every value first; only
    then resolve the target (unless given: then its config is the one used) and touch a worker."""
    cwd = cwd or Path.cwd()
    cfg = target.config if target else user_config.load(cwd)
    spec = target.spec if target else req.target.with_defaults(cfg)
    checked = _check(req, spec, cfg, cwd)
    target = target or resolve(spec, cfg)
    return _execute(req, checked, target, on_line=on_line, on_step=on_step, cwd=cwd, abort=abort)


def _check(req: RunRequest, spec: TargetSpec, cfg: UserConfig, cwd: Path) -> _Checked:
    """Everything that can be checked on this machine, before the TPU API or a worker is asked anything."""
    sop = loader.load(loader.find(req.sop))
    context = _context_defaults(sop.params, spec, cwd, given={*req.sets, *cfg.params})
    values = sop.resolve(req.sets, {**context, **cfg.params})
    _check_env_files(sop, values, {*req.sets, *cfg.params}, cwd)
    _preflight(sop, values)
    return _Checked(sop, values)


def _execute(
    req: RunRequest,
    checked: _Checked,
    target: Target,
    *,
    on_line: LineSink | None,
    on_step: Callable[[StepReport], None] | None,
    cwd: Path,
    abort: threading.Event | None = None,
) -> SopReport | DryRun:
    """One attempt on a resolved target: the fit preflight, then the plan or the run."""
    sop, values = checked.sop, checked.values
    redact = Redactor()
    transport = open_transport(target, redact)
    fit_line = _fit_preflight(sop, values, target.accelerator, skip=req.skip_fit, cwd=cwd)
    workers = select_workers(req.worker, len(transport.workers))
    executor = Executor(
        transport,
        parallel=req.parallel or target.config.parallel,
        keep_going=req.keep_going,
        force=req.force,
        local_dir=cwd,
        local_runs=user_config.state_home() / "runs",
        redact=redact,
        on_line=on_line,
        on_step=on_step,
    )
    if abort is not None:
        executor.abort = abort
    if req.dry_run:
        plan = executor.plan(sop, values, DRY_RUN_ID, workers)
        return DryRun(sop.name, transport.name, workers, values, plan, fit_line, target)
    run_id = req.run_id or new_run_id(sop.name)
    _record(
        run_id, sop.name, target.spec, workers, values, secret_files(sop, values, cwd), runs_dir(sop, values)
    )
    from tpuops.run.store import OffsetWriter, save_result

    executor.on_offset = OffsetWriter(run_id)
    try:
        unreachable = connect_all(transport, workers, executor.parallel, keep_going=req.keep_going)
        reachable = [w for w in workers if w not in unreachable]
        report = executor.execute(sop, values, run_id, reachable)
        if unreachable:
            report.workers = list(workers)
            report.steps.insert(0, _connect_step(workers, unreachable))
    finally:
        transport.close()
    if sop.scan is not None:
        warmup = int(values.get("warmup", sop.scan.warmup))  # type: ignore[arg-type]
        report.log = _scan(sop, report, user_config.state_home() / "runs" / run_id, warmup)
    if exit_code(report) == ExitCode.OOM:
        report.hint = oom_hint(str(values.get("config") or "CONFIG"), target.accelerator)
    save_result(run_id, report.to_dict(int(exit_code(report))))
    return report


def exit_code(report: SopReport) -> ExitCode:
    """The process exit code for a finished SOP (see README: Exit codes)."""
    failure = report.first_failure()
    log = report.log
    cause = log.cause() if log is not None else None
    if failure is None:
        if cause is not None:
            return _LOG_FAILURE_CODES.get(cause.kind, ExitCode.FAILED)
        if log is not None and report.fail_on_recompile and log.recompiled:
            return ExitCode.RECOMPILE
        return ExitCode.OK
    step, worker, outcome = failure
    if step.kind == "preflight":  # the consistency check refused to start the run
        return ExitCode.INCONSISTENT
    kind = step.error_kind.get(worker)
    if kind in {"connect", "host_key"}:
        return ExitCode.CONNECT
    if kind == "usage":  # bad input only the worker could see (a branch the remote does not have)
        return ExitCode.USAGE
    codes = {"busy": ExitCode.TPU_BUSY, "timeout": ExitCode.TIMEOUT, "hang": ExitCode.HANG}
    if outcome.status == "failed" and cause is not None:
        return _LOG_FAILURE_CODES.get(cause.kind, ExitCode.FAILED)
    return codes.get(outcome.status, ExitCode.FAILED)


_LOG_FAILURE_CODES = {"oom": ExitCode.OOM, "tpu_busy": ExitCode.TPU_BUSY}


def oom_hint(config: str, accelerator: str | None) -> str:
    """What to do about an out-of-memory: find a batch that fits this accelerator before spending a VM on it."""
    return (
        f"find a batch that fits: tpuops fit {config} --accelerator {accelerator or 'TYPE'} "
        "--set train.micro_batch=... (a smaller train.micro_batch, or more gradient accumulation)"
    )


def preflight_argv(sop: loader.Sop, values: dict[str, object]) -> list[list[str]]:
    """Each preflight check's argv with the values in: a list parameter (the trainer overrides, `maps_to`
    values included) splices in as separate words, so the check sees exactly what the workers will get."""
    import sys

    scope = {**values, "local_python": sys.executable}
    argvs = []
    for check in sop.preflight:
        argv: list[str] = []
        for word in check.argv:
            whole = TEMPLATE.fullmatch(word)
            if whole and isinstance(scope.get(whole.group(1)), list):
                argv.extend(scope[whole.group(1)])  # type: ignore[arg-type]
            else:
                argv.append(TEMPLATE.sub(lambda m: str(scope[m.group(1)]), word))
        argvs.append(argv)
    return argvs


def _preflight(sop: loader.Sop, values: dict[str, object]) -> None:
    """Local checks that must pass before any remote command (e.g. the trainer validating its --set keys)."""
    for check, argv in zip(sop.preflight, preflight_argv(sop, values), strict=True):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise UsageError(f"{check.what} check could not run: {e}") from None
        if r.returncode != 0:
            lines = [ln for ln in (r.stderr or r.stdout).strip().splitlines() if ln.strip()]
            last = lines[-1] if lines else f"exit {r.returncode}"
            raise UsageError(f"{check.what}: {last.removeprefix('config: ')}")


def _fit_preflight(
    sop: loader.Sop, values: dict[str, object], accelerator: str | None, *, skip: bool, cwd: Path
) -> str | None:
    """On a VM, before any SSH: the trainer config compiled for the VM's TPU type (cached). A config that
    does not fit stops here (exit 11); without libtpu on this machine one warning line and the run goes on."""
    if sop.fit is None or skip or not accelerator:
        return None
    from tpuops.checks import fit
    from tpuops.console import note

    config = TEMPLATE.sub(lambda m: str(values[m.group(1)]), sop.fit.config)
    sets = values.get(sop.fit.sets.strip("{}"), []) if sop.fit.sets else []
    try:
        result = fit.check(config, list(sets), accelerator=accelerator, cwd=cwd)  # type: ignore[arg-type]
    except fit.FitUnavailableError as e:
        note(f"fit: not checked ({e.message}); the run goes on (--skip-fit silences this)")
        return f"not checked: {e.message}"
    fit.require_fit(result)
    line = fit.summary(result)
    note(f"fit: {line}{' (cached)' if result.get('cached') else ''}")
    return line


def _scan(sop: loader.Sop, report: SopReport, local_run: Path, warmup: int):
    """Read what the run left (fetched logs, or each worker's stdout) with the log parser."""
    from tpuops.run import scan

    assert sop.scan is not None
    report.fail_on_recompile = sop.scan.fail_on_recompile
    if sop.scan.source == "log":
        if not scan.run_logs(local_run):
            return None
        return scan.scan_run(local_run, warmup)
    scanners: dict[int, scan.LogScanner] = {}
    for step in report.steps:
        for w, results in sorted(step.results.items()):
            scanner = scanners.setdefault(w, scan.LogScanner(warmup=warmup, worker=w))
            for r in results:
                for line in r.stdout.splitlines():
                    scanner.feed(line)
    parts = [s.close() for _, s in sorted(scanners.items())]
    return scan.merge(parts) if parts else None


def _connect_step(workers: list[int], unreachable: dict[int, TpuopsError]) -> StepReport:
    from tpuops.sop.model import Outcome

    step = StepReport("connect", "connect")
    for w in workers:
        if w in unreachable:
            step.outcomes[w] = Outcome("failed", unreachable[w].line())
            step.error_kind[w] = unreachable[w].kind
        else:
            step.outcomes[w] = Outcome("ok", "connected")
    return step


def _context_defaults(params: dict, target: TargetSpec, cwd: Path, *, given: set[str]) -> dict[str, object]:
    """Defaults taken from where tpuops runs: the repository to sync is this checkout (locally, its path)
    at its HEAD commit. Parameters the user gave (`given`: --set or the config file) are not looked up."""
    found: dict[str, object] = {}
    if target.kind == "local" and "venv" in params:
        # Locally the trainer runs in this very interpreter (installed with the trainer extra): no new venv.
        import sys

        found.update({"venv": "none", "python": sys.executable})
        shared = Path(__file__).resolve().parents[2].parent / "shared" / "data"
        if "data_dir" in params and shared.is_dir():
            found["data_dir"] = str(shared)  # the scratch checkout has no ../shared beside it
    if "repo_url" not in params or "repo_url" in given:
        return found
    url = (
        _git(cwd, "rev-parse", "--show-toplevel")
        if target.kind == "local"
        else _git(cwd, "remote", "get-url", "origin")
    )
    if not url and target.kind == "local":
        # Outside a checkout: the checkout tpuops itself runs from (its trainer/ is what runs locally).
        cwd = Path(__file__).resolve().parents[2]
        url = _git(cwd, "rev-parse", "--show-toplevel")
    if not url:
        return found
    found["repo_url"] = url
    head = _git(cwd, "rev-parse", "HEAD")
    if "branch" in params and "branch" not in given and head:
        # The workers run exactly this commit; remotely that needs it pushed (locally the checkout is the remote).
        if target.kind != "local" and not _git(cwd, "branch", "-r", "--contains", head):
            raise UsageError(
                f"this checkout's HEAD {head[:7]} is not on any remote branch, so the workers cannot fetch it",
                hint="git push it, or pass --set branch=NAME",
            )
        found["branch"] = head
    return found


def _git(cwd: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def secret_files(sop: loader.Sop, values: dict[str, object], cwd: Path) -> list[str]:
    """The local .env files whose values this run may print (sync_env sources, the .env of secret_env): a later
    `attach` or `logs` reads them again to redact those values from what the workers' logs say."""
    from tpuops.sop.steps import SyncEnv

    ctx = _context(values, cwd)
    found = [cwd / ".env", *(s.local_path(ctx) for s in sop.steps if isinstance(s, SyncEnv))]
    return sorted({str(p.resolve()) for p in found})


def _check_env_files(sop: loader.Sop, values: dict[str, object], given: set[str], cwd: Path) -> None:
    """Every .env a sync_env step would send parses and can be written (exit 2 otherwise); one named with
    --set (or tpuops.toml, or `required: true`) must exist: a typo must not leave a stale .env in use."""
    from tpuops.sop import secrets
    from tpuops.sop.steps import SyncEnv

    ctx = _context(values, cwd)
    for step in sop.steps:
        if not isinstance(step, SyncEnv):
            continue
        path = step.local_path(ctx)
        named = step.required or any(m.group(1) in given for m in TEMPLATE.finditer(step.source))
        if path.exists() or named:
            secrets.load(path)  # "PATH: file not found" when it was named and is not there


def runs_dir(sop: loader.Sop, values: dict[str, object]) -> str:
    """Where the SOP's `run` step keeps its runs on the workers (attach, logs and stop look there)."""
    from tpuops.sop.runs import Run

    step = next((s for s in sop.steps if isinstance(s, Run)), None)
    return _context(values).raw(step.runs_dir) if step else str(values.get("runs_dir", "~/tpuops/runs"))


def _context(values: dict[str, object], cwd: Path | None = None) -> PlanContext:
    """Worker 0's plan context: for the step fields that are the same on every worker."""
    return PlanContext(worker=0, num_workers=1, run_id="", values=values, local_dir=cwd or Path.cwd())


def _record(
    run_id: str,
    sop: str,
    target: TargetSpec,
    workers: list[int],
    values: dict,
    secret_files: list[str],
    runs_dir: str,
) -> None:
    """Remember how to reach a run again (`tpuops runs`, attach, logs); holds no secret (only where they are)."""
    d = user_config.state_home() / "runs" / run_id
    d.mkdir(parents=True, exist_ok=True)
    record = {
        "run_id": run_id,
        "sop": sop,
        "target": dict(target.__dict__),
        "workers": workers,
        "values": {k: v for k, v in values.items()},
        "started": time.time(),
        "secret_files": secret_files,
        "runs_dir": runs_dir,
    }
    write_atomic(d / "run.json", json.dumps(record, indent=1, default=str))  # never half a record
