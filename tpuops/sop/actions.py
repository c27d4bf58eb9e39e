"""What a step's plan is made of: commands, uploads and log-following, rendered the same for --dry-run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tpuops.logs.actions import Fetch, Follow
from tpuops.transport.base import LineSink

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
    # `preparing venv: collecting flax>=0.10` while pip works.
    progress: bool = False
    what: str = ""  # the plan's one line for people (`--dry-run` without --verbose); the script is the truth

    def render(self) -> str:
        names = [*self.env, *self.secret_env]
        prefix = f"[env over stdin: {', '.join(names)}] " if names else ""
        return prefix + self.script

    def summary(self) -> str:
        """One line: what the script does (its first line when it does not say), the names sent over stdin."""
        names = [*self.env, *self.secret_env]
        first = next((ln.strip() for ln in self.script.splitlines() if ln.strip()), "")
        text = self.what or (first if len(first) <= 100 else first[:99] + "…")
        return text + (f" [env over stdin: {', '.join(names)}]" if names else "")


@dataclass(frozen=True)
class Upload:
    """Send a local file over SFTP (never on a command line), written with `mode` before any content."""

    local: Path
    remote: str
    mode: int = 0o600
    digest: str = ""  # short sha256 of what will be sent, shown instead of the content
    plain: bool = False  # sent as it is (a patch); False: a .env, read and written by tpuops.config.secrets

    def render(self) -> str:
        return f"sftp put {self.local.name} -> {self.remote} (mode {self.mode:04o}, sha256 {self.digest})"


Action = Command | Upload | Follow | Fetch


def summarize_plan(plan: list[tuple[str, dict[int, list[Action]]]]) -> str:
    """The plan people read (`--dry-run`): one line per step per worker, its actions' one-line summaries joined
    (`render_plan`, with --verbose, is every command in full)."""
    lines: list[str] = []
    for step_name, per_worker in plan:
        for worker, actions in sorted(per_worker.items()):
            said = "; then ".join(a.summary() if isinstance(a, Command) else a.render() for a in actions)
            lines.append(f"[w{worker}] {step_name}: {said or 'nothing'}")
    return "\n".join(lines) + "\n"


def render_plan(plan: list[tuple[str, dict[int, list[Action]]]]) -> str:
    """The exact per-worker plan as text (`--dry-run --verbose` and the golden files in tests)."""
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


def progress_sink(doing: Callable[[str], None]) -> LineSink:
    """A command's `tpuops-doing: WHAT` lines, as they come, to the live status; other lines stay unshown."""

    def sink(w: int, text: str) -> None:
        if text.startswith(DOING):
            doing(text[len(DOING) :].strip()[:80])

    return sink
