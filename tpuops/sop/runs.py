"""Step kinds for detached jobs: run (setsid nohup), follow (stream logs until exit files), fetch_log."""

from __future__ import annotations

from typing import ClassVar, Literal

from tpuops import shell
from tpuops.logs.events import NOSPACE, NOTICE, STOPPED
from tpuops.sop import compile_cache, libtpu, notice, ports
from tpuops.sop.actions import Action, Command, Fetch, Follow
from tpuops.sop.claim import HELPERS, WIDTH
from tpuops.sop.model import Outcome, PlanContext, Step, markers
from tpuops.transport.base import CmdResult, Kind


def run_dir(runs_dir: str, run_id: str) -> str:
    return f"{runs_dir.rstrip('/')}/{run_id}"


class Run(Step):
    """Start a job detached so it survives the SSH connection; logs and exit code land in the run dir."""

    kind: Literal["run"] = "run"
    command: str
    cwd: str | None = None
    runs_dir: str = "~/tpuops/runs"
    env: dict[str, str] = {}
    secret_env: list[str] = []
    source_env_file: str | None = None  # a worker-side .env sourced by the job (secrets never on argv)
    # JAX's persistent compilation cache for the job (sop/compile_cache.py): auto, off, a path or gs://...;
    # None leaves the job's environment as it is.
    compile_cache: str | None = None
    # worker 0's jax.distributed coordinator port: on a multi-worker VM each other worker must reach it before
    # the job starts (sop/ports.py)
    coordinator_port: int | str | None = None
    # The VM's preemption notice, watched beside the job (sop/notice.py): signal, file or off; None: off.
    preemption_notice: str | None = None
    # On a multislice: libtpu's megascale abort on a hang or DCN error (sop/libtpu.py), true or false; None: off.
    megascale_abort: bool | str | None = None
    template_fields: ClassVar[tuple[str, ...]] = (
        "command", "cwd", "runs_dir", "env", "source_env_file", "compile_cache", "coordinator_port",
        "preemption_notice", "megascale_abort",
    )  # fmt: skip

    def check(self, ctx: PlanContext) -> list[Action]:
        """A multi-worker job's coordinator port on worker 0, reached from each other worker (none: no check)."""
        return ports.check(ctx, self.coordinator_port)

    def check_outcome(self, results: list[CmdResult]) -> Outcome:
        return ports.verdict(results)

    def plan(self, ctx: PlanContext) -> list[Action]:
        rd = run_dir(ctx.raw(self.runs_dir), ctx.run_id)
        k = ctx.worker
        watch = notice.mode(ctx.raw(self.preemption_notice) if self.preemption_notice else None)
        cmd = ctx.command(self.command)
        body = self._body(ctx, cmd)
        # The job ends by writing its exit code over bytes reserved before it started (a disk that filled up
        # meanwhile still gets it, with a note), atomically (tmp + mv), then gives the run lock back.
        space = f'"$rd"/worker-{k}.space'
        job = (
            f"{notice.job_start(watch, k)}{body}; code=$?; note=''; "
            f"e=$(head -c 4096 /dev/zero 2>&1 > {space}) || case $e in *'No space'*) note={NOSPACE};; esac; "
            f"rm -f {space}; {notice.job_end(watch, k)}"
            f'printf "%-{WIDTH}s\\n" "$code $note" 1<> "$rd"/worker-{k}.exit.tmp; '
            f'mv -f "$rd"/worker-{k}.exit.tmp "$rd"/worker-{k}.exit; '
            '[ "$(cat "$lock/run" 2>/dev/null)" = "$rid" ] && rm -rf "$lock"; exit $code'
        )
        # One run per VM is the executor's run lock (sop/claim.py), taken before any step. Here: the pid file
        # and the exit file reserved before the job starts (a full disk fails here and starts nothing), the
        # job started in its own session, its pid written and read back (if that fails the job is stopped at
        # once: no job runs without a pid file `tpuops stop` can find), then the lock handed to the job.
        watcher = notice.install(watch)  # the notice watcher's file, beside the job's log
        script = f"""{HELPERS}
rd={shell.path(rd)}; k={k}; rid={shell.quote(ctx.run_id)}
if [ -e "$rd"/worker-$k.pid ] && alive "$(pid_of "$rd"/worker-$k.pid)"; then
  echo "tpuops: running pid=$(pid_of "$rd"/worker-$k.pid)"; exit 0; fi
mkdir -p "$rd" || exit 1
if ! err=$( {{ reserve "$rd"/worker-$k.pid && reserve "$rd"/worker-$k.exit.tmp && : > "$rd"/worker-$k.log; }} 2>&1 ); then
  rm -f "$rd"/worker-$k.pid "$rd"/worker-$k.exit.tmp; echo "$err" >&2; exit 1; fi
# The claim's stand-in holder, read before the job starts (a quick job may end and give the lock back first).
h=""; [ "$(cat "$lock/run" 2>/dev/null)" = "$rid" ] && h=$(pid_of "$lock/pid")
{watcher}export rd rid lock TPUOPS_RUN_DIR="$rd"  # the job may keep files beside its log (the trainer's config.json)
setsid nohup sh -c {shell.quote(job)} > "$rd"/worker-$k.log 2>&1 < /dev/null &
pid=$!
put "$rd"/worker-$k.pid $pid 2>/dev/null || true
if [ "$(pid_of "$rd"/worker-$k.pid)" != "$pid" ]; then
  stop_group $pid; put_exit "$rd" $k "143 {STOPPED}" 2>/dev/null
  echo "the pid file $rd/worker-$k.pid could not be written: the job was stopped" >&2; exit 1; fi
if [ "$(cat "$lock/run" 2>/dev/null)" = "$rid" ] && [ -f "$lock/pid" ]; then  # the job holds the lock now
  [ -f "$lock/start" ] && put "$lock/start" "$(stime $pid)" 2>/dev/null; put "$lock/pid" $pid 2>/dev/null; fi
if [ -n "$h" ]; then kill "$h" 2>/dev/null; fi
echo "tpuops: started pid=$pid"
"""
        # On a multislice the MEGASCALE_* variables join the SOP's own (jax.distributed's TRAINER_* among them).
        env = {**ctx.megascale_env(), **{k_: ctx.raw(v) for k_, v in self.env.items()}}
        # Not cancelled when another worker fails: a start cut short could leave a job without its pid file.
        # The executor stops what started instead (all or none).
        where = f" in {ctx.raw(self.cwd)}" if self.cwd else ""
        what = f"start in the background{where}: {' '.join(cmd.split())} (log {rd}/worker-{k}.log)"
        return [
            Command(
                script, env=env, secret_env=tuple(self.secret_env), timeout=60, cancellable=False, what=what
            )
        ]

    def _body(self, ctx: PlanContext, cmd: str) -> str:
        """The command as the job runs it: in `cwd`, after the .env file, with the compile cache and the hang
        abort's exports."""
        body = cmd
        if self.compile_cache is not None:  # after .env is read: `auto` keeps a cache the .env names
            body = f"{compile_cache.export(ctx.raw(self.compile_cache), ctx.raw(self.cwd or ''))} {body}"
        abort = None if self.megascale_abort is None else str(self.megascale_abort)
        if hang_abort := libtpu.export(ctx, abort):  # after .env too: its own LIBTPU_INIT_ARGS come last
            body = f"{hang_abort} {body}"
        if self.source_env_file:
            f = shell.path(ctx.raw(self.source_env_file))
            body = f"if [ -f {f} ]; then set -a; . {f}; set +a; fi; {body}"
        if self.cwd:
            body = f"cd {shell.path(ctx.raw(self.cwd))} && {body}"
        return body

    def outcome(self, results: list[CmdResult]) -> Outcome:
        r = results[-1] if results else None
        if r is not None and not r.ok and "No space left on device" in r.stderr:
            return Outcome("failed", "no space left on device for the run's files: nothing was started")
        found = markers(r.stdout) if r is not None and r.ok else []
        if not found:
            return super().outcome(results)
        m = found[-1]
        if m["_"].startswith("running"):
            return Outcome("nothing", f"already running (pid {m['pid']})", {"pid": int(m["pid"])})
        return Outcome("changed", f"started pid {m['pid']}", {"pid": int(m["pid"])})


class FollowStep(Step):
    """Stream the run's logs, each line prefixed [w<k>], until every worker's exit file exists."""

    kind: Literal["follow"] = "follow"
    runs_dir: str = "~/tpuops/runs"
    stream: Literal["all", "first"] = "all"
    timeout: float | str = 3600.0  # seconds, or a template such as "{timeout}"
    poll_s: float = 0.5
    hang_factor: float | str = 0.0
    hang_min_s: float | str = 60.0
    on_hang: Literal["stop", "wait"] | str = "stop"
    py_spy: bool | str = False
    template_fields: ClassVar[tuple[str, ...]] = (
        "runs_dir",
        "timeout",
        "hang_factor",
        "hang_min_s",
        "on_hang",
        "py_spy",
    )

    def outcome(self, results: list[CmdResult]) -> Outcome:
        """From the follower's result: the job's exit code, or why following ended (hung, timed out...)."""
        r = results[-1]
        if r.kind is Kind.HUNG:
            return Outcome("hang", r.error or "hung", {"py_spy": r.stdout} if r.stdout else {})
        if r.kind is Kind.DETACHED:
            return Outcome("detached", "detached: the job goes on")
        if r.job_exit is None:  # following ended before the job did
            # cancelled: another worker's failure is the run's cause, not this worker's follow
            status = (
                "timeout" if r.kind is Kind.TIMEOUT else "cancelled" if r.kind is Kind.CANCELLED else "failed"
            )
            return Outcome(status, r.error or f"{r.kind}")
        code = r.job_exit
        if NOSPACE in r.job_notes:  # the job ended, but what it wrote since the disk filled up is lost
            detail = f"job exited {code}; no space left on device on the worker (its log may be cut short)"
            return Outcome("failed", detail, {"exit_code": code, "no_space": True})
        if STOPPED in r.job_notes:
            return Outcome("failed", f"job stopped (exit {code})", {"exit_code": code, "stopped": True})
        if NOTICE in r.job_notes and code != 0:  # it ended on the VM's notice (sop/notice.py), as asked
            detail = f"job stopped on the VM's preemption notice (exit {code})"
            return Outcome("failed", detail, {"exit_code": code, "notice": True})
        return Outcome("ok" if code == 0 else "failed", f"job exited {code}", {"exit_code": code})

    def plan(self, ctx: PlanContext) -> list[Action]:
        def num(name: str) -> float:
            return float(ctx.number(getattr(self, name), name) or 0.0)

        on_hang = ctx.raw(self.on_hang)
        if on_hang not in ("stop", "wait"):
            raise ValueError(f"on_hang must be stop or wait, received {on_hang!r}")
        py_spy = (
            ctx.raw(self.py_spy).lower() in ("true", "1") if isinstance(self.py_spy, str) else self.py_spy
        )
        return [
            Follow(
                run_dir(ctx.raw(self.runs_dir), ctx.run_id),
                self.stream,
                num("timeout"),
                self.poll_s,
                hang_factor=num("hang_factor"),
                hang_min_s=num("hang_min_s"),
                on_hang=on_hang,
                py_spy=py_spy,
            )
        ]


class FetchLog(Step):
    """Bring each worker's log back to the local run directory."""

    kind: Literal["fetch_log"] = "fetch_log"
    runs_dir: str = "~/tpuops/runs"
    always: bool = True
    template_fields: ClassVar[tuple[str, ...]] = ("runs_dir",)

    def plan(self, ctx: PlanContext) -> list[Action]:
        return [Fetch(run_dir(ctx.raw(self.runs_dir), ctx.run_id))]
