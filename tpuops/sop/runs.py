"""Step kinds for detached jobs: run (setsid nohup), follow (stream logs until exit files), fetch_log."""

from __future__ import annotations

from typing import ClassVar, Literal

from tpuops import shell
from tpuops.sop.actions import Action, Command, Fetch, Follow
from tpuops.sop.model import Outcome, PlanContext, Step, markers
from tpuops.sop.steps import BUSY_EXIT
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
    template_fields: ClassVar[tuple[str, ...]] = ("command", "cwd", "runs_dir", "env", "source_env_file")

    def plan(self, ctx: PlanContext) -> list[Action]:
        rd = run_dir(ctx.raw(self.runs_dir), ctx.run_id)
        k = ctx.worker
        body = ctx.command(self.command)
        if self.source_env_file:
            f = shell.path(ctx.raw(self.source_env_file))
            body = f"if [ -f {f} ]; then set -a; . {f}; set +a; fi; {body}"
        if self.cwd:
            body = f"cd {shell.path(ctx.raw(self.cwd))} && {body}"
        # The job writes its exit code atomically (tmp + mv) so a reader never sees a half-written file.
        job = f'{body}; code=$?; echo $code > "$rd"/worker-{k}.exit.tmp && mv "$rd"/worker-{k}.exit.tmp "$rd"/worker-{k}.exit'
        runs = shell.path(ctx.raw(self.runs_dir))
        force = "1" if ctx.force else "0"
        # One run per VM: another run's live job on this worker is refused (or, with --force, stopped first).
        # A job leads its own process group (setsid) and a child can outlive the leader, so the holder is
        # stopped and waited for as a group. `kill -SIG "-PGID"`, not `kill -SIG -- -PGID`: dash has no `--`.
        script = f"""set -e
{shell.RUNNING}
rd={shell.path(rd)}; mkdir -p "$rd"
if [ -e "$rd"/worker-{k}.pid ] && alive "$(cat "$rd"/worker-{k}.pid)"; then
  echo "tpuops: running pid=$(cat "$rd"/worker-{k}.pid)"; exit 0; fi
for f in {runs}/*/worker-*.pid; do
  [ -e "$f" ] || continue; pid=$(cat "$f"); other=$(basename "$(dirname "$f")")
  [ -e "${{f%.pid}}.exit" ] && continue  # finished (its exit code is written just before it ends)
  running "$pid" || continue
  if [ {force} != 1 ]; then
    echo "tpuops: active run=$other pid=$pid"; echo "run $other (pid $pid) is active" >&2; exit {BUSY_EXIT}; fi
  kill -TERM "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  i=0; while running "$pid" && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  if running "$pid"; then kill -KILL "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; fi
  while running "$pid"; do sleep 0.05; done
  x="${{f%.pid}}.exit"; [ -e "$x" ] || echo 143 > "$x"
  echo "tpuops: stopped run=$other pid=$pid"
done
export rd TPUOPS_RUN_DIR="$rd"  # the job may keep files beside its log (the trainer's config.json)
setsid nohup sh -c {shell.quote(job)} > "$rd"/worker-{k}.log 2>&1 < /dev/null &
echo $! > "$rd"/worker-{k}.pid
echo "tpuops: started pid=$!"
"""
        env = {k_: ctx.raw(v) for k_, v in self.env.items()}
        return [Command(script, env=env, secret_env=tuple(self.secret_env), timeout=60)]

    def outcome(self, results: list[CmdResult]) -> Outcome:
        r = results[-1] if results else None
        if r is not None and r.kind is Kind.EXIT and r.exit_code == BUSY_EXIT:
            active = [m for m in markers(r.stdout) if m["_"].startswith("active")]
            who = ", ".join(f"run {m['run']} (pid {m['pid']})" for m in active)
            return Outcome(
                "busy", f"{who} is active on this worker (use --force to stop it)", {"active": who}
            )
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
        if r.job_exit is None:  # following ended before the job did
            # cancelled: another worker's failure is the run's cause, not this worker's follow
            status = (
                "timeout" if r.kind is Kind.TIMEOUT else "cancelled" if r.kind is Kind.CANCELLED else "failed"
            )
            return Outcome(status, r.error or f"{r.kind}")
        code = r.job_exit
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
                step_pattern=str(ctx.values["step_pattern"]) if ctx.values.get("step_pattern") else None,
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
