"""What a step's plan is made of: commands, uploads and log-following, rendered the same for --dry-run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Command:
    """A POSIX sh script for one worker. Env values travel over stdin; the plan shows names only."""

    script: str
    env: dict[str, str] = field(default_factory=dict)
    secret_env: tuple[str, ...] = ()  # names whose values come from the local .env at execution time
    timeout: float | None = None
    stream: bool = False  # show each output line live, prefixed by its worker

    def render(self) -> str:
        names = [*self.env, *self.secret_env]
        prefix = f"[env over stdin: {', '.join(names)}] " if names else ""
        return prefix + self.script


@dataclass(frozen=True)
class Upload:
    """Send a local file over SFTP (never on a command line), written with `mode` before any content."""

    local: Path
    remote: str
    mode: int = 0o600
    digest: str = ""  # short sha256 of what will be sent, shown instead of the content

    def render(self) -> str:
        return f"sftp put {self.local.name} -> {self.remote} (mode {self.mode:04o}, sha256 {self.digest})"


@dataclass(frozen=True)
class Follow:
    """Stream worker logs from a byte offset until every exit file exists or the timeout passes."""

    run_dir: str
    stream: str = "all"  # "all" workers' lines, or "first" (process 0 only; all are still watched)
    timeout: float = 3600.0
    poll_s: float = 0.5
    # Hang detection on process 0's `step=` lines: no new one within max(hang_min_s, hang_factor x the
    # expected step time): the median steady step after hang_warmup steps, before that the longest step so
    # far (step 0 holds the compile). 0 turns it off.
    hang_factor: float = 0.0
    hang_warmup: int = 2
    hang_min_s: float = 60.0
    on_hang: str = "stop"  # stop: fail the step; wait: report and keep following
    py_spy: bool = False  # on a hang, collect `py-spy dump` of the job's Python process

    def render(self) -> str:
        hang = (
            f", hang after {self.hang_factor:g}x median step (min {self.hang_min_s:g}s)"
            if self.hang_factor
            else ""
        )
        return f"follow {self.run_dir}/worker-<k>.log until worker-<k>.exit (timeout {self.timeout:g}s{hang})"


@dataclass(frozen=True)
class Fetch:
    """Copy worker logs back to the local run directory."""

    run_dir: str

    def render(self) -> str:
        return f"fetch {self.run_dir}/worker-<k>.log -> local run directory"


Action = Command | Upload | Follow | Fetch


def render_plan(plan: list[tuple[str, dict[int, list[Action]]]]) -> str:
    """The exact per-worker plan as text (the --dry-run output and the golden files in tests)."""
    lines: list[str] = []
    for step_name, per_worker in plan:
        lines.append(f"== {step_name}")
        for worker, actions in sorted(per_worker.items()):
            for action in actions:
                text = action.render()
                head, *rest = text.splitlines() or [""]
                lines.append(f"[w{worker}] {head}")
                lines.extend(f"[w{worker}]   {r}" for r in rest)
    return "\n".join(lines) + "\n"
