"""The library call behind `tpuops sop run` and its aliases: validate everything, then plan or execute."""

from __future__ import annotations

import os
import secrets as _secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tpuops import config as user_config
from tpuops.config import TargetSpec, UserConfig
from tpuops.errors import ExitCode, TpuopsError, UsageError
from tpuops.logs.events import Event
from tpuops.logs.fields import parse_columns
from tpuops.logs.follow import Readings
from tpuops.run import autostop, bundled, prepare, profile, tree
from tpuops.run.estimate import Estimate
from tpuops.run.result import Planned, RunResult
from tpuops.run.store import ScanRecord, WatchRecord, env_values, record_start
from tpuops.run.target import Target, connect_all, keep_route, open_transport, resolve, select_workers
from tpuops.shell import Redactor
from tpuops.sop import loader
from tpuops.sop.executor import Executor, SopReport, StepReport
from tpuops.transport.base import LineSink, Transport

DRY_RUN_ID = "DRY-RUN"


@dataclass(frozen=True)
class RunRequest:
    sop: str
    sets: dict[str, str] = field(default_factory=dict)
    target: TargetSpec = field(default_factory=TargetSpec)
    worker: str = "all"
    dry_run: bool = False
    # With dry_run: read each worker (read-only) for what the steps would change beyond the plan: the local edits
    # a git sync would discard. The CLI's --dry-run does unless --offline; off, a dry run never connects.
    inspect: bool = False
    offline: bool = False  # with dry_run: nothing runs, not even the SOP's local checks (--offline)
    force: bool = False
    keep_going: bool = False
    parallel: int | None = None
    run_id: str | None = None
    skip_fit: bool = False  # --skip-fit: start without the ahead-of-time fit check
    command: tuple[str, ...] = ()  # the words after `--`: the SOP's `cmd` list, verbatim


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


@dataclass(frozen=True)
class _Hooks:
    """What the caller hears during an attempt: the workers' lines, each step's report, the phases, tpuops'
    own notices, the follower's typed events (the recovery's step count), and the two events set from outside
    (`abort`: the VM watch; `detach`: the CLI's first Ctrl-C)."""

    on_line: LineSink | None = None
    on_step: Callable[[StepReport], None] | None = None
    on_phase: Callable[[int, str, str, str], None] | None = None
    on_notice: Callable[[str], None] | None = None
    on_event: Callable[[Event], None] | None = None
    abort: threading.Event | None = None
    detach: threading.Event | None = None


def start(
    req: RunRequest,
    *,
    max_recoveries: int | None = None,
    unreachable_s: float | None = None,
    watch_s: float = 10.0,
    ready_timeout: float = 1800.0,
    on_line: LineSink | None = None,
    on_step: Callable[[StepReport], None] | None = None,
    on_phase: Callable[[int, str, str, str], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    notify: Callable[[str], None] | None = None,
    cwd: Path | None = None,
    target: Target | None = None,
    detach: threading.Event | None = None,
) -> RunResult:
    """The one library entry of every SOP run (the CLI's commands and bench alike): the config loaded once,
    the SOP and its values checked, the target resolved once (or `target`, resolved by an earlier call of
    the same command: its config is the one used), then the plan (--dry-run: a RunResult whose `planned`
    holds it, exit code 0) or the run. On a VM the run is always watched through the TPU API: a lost VM ends
    it at once (a RunResult with exit 8, its steps and what to do), or with `max_recoveries` (--recover) is
    recreated and the SOP runs again (see `recover.watched`). `notify` hears the TPU API's retries; `on_notice`
    tpuops' own notices (a recovery, a checkpoint warning). `detach`, set from outside (the CLI's first Ctrl-C),
    stops following and leaves the job running (the report's `interrupted` says "detached"), or, before any
    job started, cancels the start (nothing is left running)."""
    from tpuops.run import recover

    cwd = cwd or Path.cwd()
    cfg = target.config if target else user_config.load(cwd)
    spec = target.spec if target else req.target.with_defaults(cfg)  # the VM may come from tpuops.toml
    watched = not req.dry_run and (max_recoveries is not None or spec.kind == "vm")
    if watched and spec.kind != "vm":
        raise UsageError("--recover needs --vm: only a VM can be watched and recreated")
    checked = _check(req, spec, cfg, cwd, on_notice)
    if watched and max_recoveries and checked.sop.overrides and on_notice:  # a trainer SOP: can it resume?
        for warning in recover.checkpoint_warnings(req.sets):
            on_notice(warning)
    target = target or resolve(spec, cfg, notify)
    hooks = _Hooks(on_line, on_step, on_phase, on_notice, detach=detach)
    if not watched:
        return _execute(req, checked, target, hooks, cwd)
    unreachable = cfg.unreachable_s if unreachable_s is None else unreachable_s
    # In the run's record: attach watches the same, and says how to recover a lost VM of a run that recovers.
    watch: WatchRecord = {
        "unreachable_s": unreachable,
        "watch_s": watch_s,
        "recover": bool(max_recoveries),
    }

    def attempt(
        run_id: str, now: Target, abort: threading.Event, on_event: Callable[[Event], None]
    ) -> RunResult:
        each = replace(hooks, abort=abort, on_event=on_event)
        return _execute(replace(req, run_id=run_id), checked, now, each, cwd, watch=watch)

    return recover.watched(
        target, attempt, base_id=req.run_id or new_run_id(req.sop), sop=req.sop, max_recoveries=max_recoveries or 0,
        watch_s=watch_s, unreachable_s=unreachable, ready_timeout=ready_timeout, on_notice=on_notice, notify=notify,
    )  # fmt: skip


def _check(
    req: RunRequest,
    spec: TargetSpec,
    cfg: UserConfig,
    cwd: Path,
    on_notice: Callable[[str], None] | None = None,
) -> _Checked:
    """Everything that can be checked on this machine, before the TPU API or a worker is asked anything. A
    SOP's own local commands (its `preflight:`) run for a dry run only when it may connect, and it says so;
    `--offline` runs none."""
    sop = loader.load(loader.find(req.sop, loader.search_dirs(cwd)))
    for note in prepare.check_params(sop, cfg, cwd):  # [params] of tpuops.toml: a typo is exit 2
        if on_notice is not None:
            on_notice(note)
    sets: dict[str, object] = dict(req.sets)
    pattern = _step_pattern(sop, sets)
    columns = None if "columns" in sop.params else parse_columns(sets.pop("columns", None))
    _take_command(sop, req.command, sets)
    profile.check_steps(sop.name, set(sop.params), sets)  # --profile-steps A-B: a SOP that traces, a range
    given = {**cfg.params, **sets}
    context = prepare.context_defaults(
        sop.params, spec, cwd, given=set(given), given_values=given, trainer=sop.trainer
    )
    if context.get("repo_url") and (made := bundled.describe(str(context["repo_url"]))) and on_notice:
        on_notice(made)
    values = sop.resolve(sets, {**context, **cfg.params})  # type: ignore[arg-type]
    if pattern:
        values["step_pattern"] = pattern  # the scan's, the live follower's and attach's step lines
    if columns:
        values["columns"] = columns  # the steps table's fields (run.json keeps them for `tpuops report`)
    travels = tree.take(sop.params, values, {*sets, *cfg.params}, cwd)  # the uncommitted change, if any
    if travels and on_notice:
        on_notice(travels)
    prepare.check_env_files(sop, values, {*sets, *cfg.params}, cwd)
    checks = ", ".join(c.what for c in sop.preflight)
    if req.dry_run and req.offline:
        if checks and on_notice:
            on_notice(f"--offline: the SOP's local checks were not run ({checks})")
    else:
        if req.dry_run and checks and on_notice:
            on_notice(f"dry run: ran the SOP's local checks on this machine ({checks}); --offline runs none")
        prepare.check_trainer(sop, values)
    _check_plan(sop, values, cwd)
    return _Checked(sop, values)


def _step_pattern(sop: loader.Sop, sets: dict[str, object]) -> str | None:
    """`--set step_pattern=REGEX` (any SOP that reads a log: `scan:`), else the SOP's `scan.step_pattern`;
    checked here (exit 2 naming it). Taken out of `sets`: it is the scanner's setting, not a parameter."""
    from tpuops.logs.lines import compile_step_pattern

    given = sets.pop("step_pattern", None) if "step_pattern" not in sop.params else None
    if given is not None and sop.scan is None:
        raise UsageError(f"step_pattern: SOP {sop.name} reads no log (it has no `scan:`)")
    pattern = str(given) if given else (sop.scan.step_pattern if sop.scan else None)
    if pattern:
        compile_step_pattern(pattern)
    return pattern or None


def _take_command(sop: loader.Sop, command: tuple[str, ...], sets: dict[str, object]) -> None:
    """The words after `--` become the SOP's `cmd` list parameter, word for word (quoted on the worker)."""
    param = sop.params.get("cmd")
    takes = param is not None and param.type == "list"
    if command and not takes:
        raise UsageError(
            f"SOP {sop.name} takes no command after `--`",
            hint="your own command runs with `tpuops run job -- CMD ...` or `tpuops recompile-check -- CMD ...`",
        )
    if command:
        sets["cmd"] = list(command)
    elif takes and param.default is None and "cmd" not in sets:  # type: ignore[union-attr]
        raise UsageError(
            f"SOP {sop.name} needs your command after `--`",
            hint=f"for example: tpuops run {sop.name} --local -- python -u scripts/train.py --config c.yaml",
        )


def _check_plan(sop: loader.Sop, values: dict[str, object], cwd: Path) -> None:
    """Every step planned once (pure: no worker is asked) so a value only a step checks (`timeout=-1`, a
    negative poll interval) is bad input before anything runs, not a failure halfway through the SOP."""
    from tpuops.sop.model import PlanContext

    paths = frozenset(k for k, p in sop.params.items() if p.type == "path")
    ctx = PlanContext(0, 1, DRY_RUN_ID, values, local_dir=cwd, paths=paths)
    for step in sop.steps:
        try:
            actions = step.plan(ctx)
        except ValueError as e:  # a step's own check of a templated field (on_hang: stop or wait)
            raise UsageError(f"SOP {sop.name}, step {step.title}: {e}") from None
        prepare.check_command_sizes(sop, step.title, actions)  # too long for a worker's shell: exit 2


def _execute(
    req: RunRequest,
    checked: _Checked,
    target: Target,
    hooks: _Hooks,
    cwd: Path,
    *,
    watch: WatchRecord | None = None,
) -> RunResult:
    """One attempt on a resolved target: the fit preflight, then the plan or the run and its one result."""
    sop, values = checked.sop, checked.values
    secret_files = prepare.secret_files(sop, values, cwd)
    # Known before the first step: a worker that already has this .env gets nothing sent, yet its job prints it.
    redact = Redactor(env_values(secret_files))
    # A dry run changes nothing: its first connection pushes no key (workers that need one are not read).
    transport = open_transport(target.read_only() if req.dry_run else target, redact)
    vm = target.vm
    fit_line, estimate = prepare.fit_preflight(
        sop, values, target.accelerator, skip=req.skip_fit, cwd=cwd, zone=vm.zone if vm else None,
        endpoint=os.environ.get("TPUOPS_BILLING_API") or target.spec.api_endpoint,
        slices=max(1, len(vm.slices)) if vm else 1,  # a multislice is judged as one (its DCN bytes too)
    )  # fmt: skip
    workers = select_workers(req.worker, len(transport.workers))
    executor = _executor(req, target, transport, redact, hooks, cwd)
    if req.dry_run:
        return _dry_run(req, checked, target, executor, workers, fit_line, estimate)
    run_id = req.run_id or new_run_id(sop.name)
    _record(run_id, checked, target, workers, secret_files, estimate, cwd, watch)
    from tpuops.run.store import OffsetWriter

    executor.on_offset = OffsetWriter(run_id)
    warmup, pattern = _scan_settings(sop, values)
    executor.reads = Readings(warmup, pattern)  # the one parse of the logs: the follow and fetch feed it
    try:
        unreachable = connect_all(transport, workers, executor.parallel, keep_going=req.keep_going)
        keep_route(run_id, target, transport)  # attach, logs and stop log in the same way, no API asked
        reachable = [w for w in workers if w not in unreachable]
        # A VM with autostop on: worker 0's watcher (again), never the run's failure.
        if 0 in reachable and (said := autostop.ensure(transport, target)) and hooks.on_notice:
            hooks.on_notice(said)
        report = executor.execute(sop, values, run_id, reachable)
        if unreachable:
            report.workers = list(workers)
            report.steps.insert(0, _connect_step(workers, unreachable))
        profiled = profile.after_run(transport, report, values, prepare.runs_dir(sop, values), reachable)
    finally:
        transport.close()
    if report.interrupted == "detached":  # the job goes on: `tpuops attach` follows it and records its end
        return RunResult(report, ExitCode.INTERRUPTED, estimate=estimate)
    from tpuops.run import finish

    return finish.finished(
        sop,
        values,
        report,
        executor.reads,
        accelerator=target.accelerator,
        estimate=estimate,
        profiled=profiled,
    )


def _executor(
    req: RunRequest, target: Target, transport: Transport, redact: Redactor, hooks: _Hooks, cwd: Path
) -> Executor:
    """The executor of one attempt, wired to the caller's hooks."""
    executor = Executor(
        transport, parallel=req.parallel or target.config.parallel, keep_going=req.keep_going, force=req.force,
        local_dir=cwd, local_runs=user_config.state_home() / "runs", redact=redact, on_line=hooks.on_line,
        on_step=hooks.on_step, on_event=hooks.on_event, on_phase=hooks.on_phase,
    )  # fmt: skip
    if hooks.abort is not None:
        executor.abort = hooks.abort
    if hooks.detach is not None:
        executor.detach = hooks.detach
    return executor


def _dry_run(
    req: RunRequest,
    checked: _Checked,
    target: Target,
    executor: Executor,
    workers: list[int],
    fit_line: str | None,
    estimate: Estimate | None,
) -> RunResult:
    """--dry-run: every worker's plan, and (with `inspect`, read-only) what the steps would change beyond it."""
    sop, values = checked.sop, checked.values
    plan = executor.plan(sop, values, DRY_RUN_ID, workers)
    try:  # read-only: what the steps would change beyond the plan (git sync's local edits)
        preview = executor.preview(sop, values, DRY_RUN_ID, workers) if req.inspect else []
    finally:
        executor.transport.close()
    planned = Planned(values, plan, fit_line, target, preview)
    dry = SopReport(sop.name, DRY_RUN_ID, executor.transport.name, workers)  # no step ran
    return RunResult(dry, ExitCode.OK, estimate=estimate, planned=planned)


def _record(
    run_id: str,
    checked: _Checked,
    target: Target,
    workers: list[int],
    secret_files: list[str],
    estimate: Estimate | None,
    cwd: Path,
    watch: WatchRecord | None,
) -> None:
    """The run's record before its first step (`tpuops runs`, attach, logs, report read it), and its tree."""
    sop, values = checked.sop, checked.values
    record_start(
        run_id, sop.name, target.spec, workers, values, secret_files, prepare.runs_dir(sop, values),
        _worker_env_files(sop, values, cwd),
        _scan_record(sop, values), estimate, {**(watch or {}), "follow": prepare.hang_watch(sop, values, cwd)},
    )  # fmt: skip
    tree.keep(user_config.state_home() / "runs" / run_id, values)


def _scan_record(sop: loader.Sop, values: dict[str, object]) -> ScanRecord | None:
    """The SOP's scan settings with the step pattern the run uses (`--set step_pattern=...`), for its record."""
    if sop.scan is None:
        return None
    pattern = values.get("step_pattern")
    return {"source": sop.scan.source, "warmup": sop.scan.warmup, "fail_on_recompile": sop.scan.fail_on_recompile,
            "step_pattern": None if pattern is None else str(pattern)}  # fmt: skip


def _scan_settings(sop: loader.Sop, values: dict[str, object]) -> tuple[int, str | None]:
    """How the run's logs are read: the warm-up (the SOP's `warmup` parameter, else its `scan:`), the step
    lines' pattern (`--set step_pattern=...`, else the SOP's)."""
    if sop.scan is None:
        return 1, None
    raw = values.get("warmup", sop.scan.warmup)
    warmup = int(raw) if isinstance(raw, int | float | str) else sop.scan.warmup
    pattern = values.get("step_pattern")
    return warmup, str(pattern) if pattern else None


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


def _worker_env_files(sop: loader.Sop, values: dict[str, object], cwd: Path) -> list[str]:
    """Where sync_env puts the .env on the workers (`attach` reads it back: store.learn_sent_env)."""
    from tpuops.sop.steps import SyncEnv

    ctx = prepare.plan_context(values, cwd)
    return [ctx.raw(s.dest) for s in sop.steps if isinstance(s, SyncEnv)]
