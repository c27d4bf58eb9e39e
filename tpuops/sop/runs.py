"""Step kinds for detached jobs: run (setsid nohup), follow (stream logs until exit files), fetch_log."""

from __future__ import annotations

from typing import ClassVar, Literal

from tpuops import shell
from tpuops.sop.actions import Action, Command, Fetch, Follow
from tpuops.sop.model import Outcome, PlanContext, Step, markers
from tpuops.transport.base import CmdResult


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
        script = f"""set -e
rd={shell.path(rd)}; mkdir -p "$rd"
if [ -e "$rd"/worker-{k}.pid ] && kill -0 "$(cat "$rd"/worker-{k}.pid)" 2>/dev/null; then
  echo "tpuops: running pid=$(cat "$rd"/worker-{k}.pid)"; exit 0; fi
export rd
setsid nohup sh -c {shell.quote(job)} > "$rd"/worker-{k}.log 2>&1 < /dev/null &
echo $! > "$rd"/worker-{k}.pid
echo "tpuops: started pid=$!"
"""
        env = {k_: ctx.raw(v) for k_, v in self.env.items()}
        return [Command(script, env=env, secret_env=tuple(self.secret_env), timeout=60)]

    def outcome(self, results: list[CmdResult]) -> Outcome:
        found = markers(results[-1].stdout) if results and results[-1].ok else []
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
    template_fields: ClassVar[tuple[str, ...]] = ("runs_dir", "timeout")

    def plan(self, ctx: PlanContext) -> list[Action]:
        timeout = float(ctx.raw(self.timeout)) if isinstance(self.timeout, str) else self.timeout
        return [Follow(run_dir(ctx.raw(self.runs_dir), ctx.run_id), self.stream, timeout, self.poll_s)]


class FetchLog(Step):
    """Bring each worker's log back to the local run directory."""

    kind: Literal["fetch_log"] = "fetch_log"
    runs_dir: str = "~/tpuops/runs"
    template_fields: ClassVar[tuple[str, ...]] = ("runs_dir",)

    def plan(self, ctx: PlanContext) -> list[Action]:
        return [Fetch(run_dir(ctx.raw(self.runs_dir), ctx.run_id))]
