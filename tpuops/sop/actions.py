"""What a step's plan is made of: commands, uploads and log-following, rendered the same for --dry-run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tpuops.logs.actions import Fetch, Follow

DOING = "tpuops-doing: "  # a progress line of a Command with `progress` (not kept in the step's detail)


@dataclass(frozen=True)
class Command:
    """A POSIX sh script for one worker. Env values travel over stdin; the plan shows names only."""

    script: str
    env: dict[str, str] = field(default_factory=dict)
    secret_env: tuple[str, ...] = ()  # names whose values come from the local .env at execution time
    timeout: float | None = None
    stream: bool = False  # show each output line live, prefixed by its worker
    cancellable: bool = True  # False: runs to its end even when another worker failed (a job's start)
    # Lines `tpuops-doing: WHAT` it prints say what it is doing now (the live status line shows them):
    # `preparing venv: collecting jax>=0.4.35` while pip works.
    progress: bool = False

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
    plain: bool = False  # sent as it is (a patch); False: a .env, read and written by tpuops.sop.secrets

    def render(self) -> str:
        return f"sftp put {self.local.name} -> {self.remote} (mode {self.mode:04o}, sha256 {self.digest})"


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
