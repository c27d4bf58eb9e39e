"""Before anything runs: SOP values taken from this checkout, the local checks (.env files, the trainer's
`--print-config` on the overrides) and the fit preflight for the VM's TPU."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from tpuops import shell
from tpuops.config import TargetSpec, UserConfig
from tpuops.errors import UsageError
from tpuops.run.estimate import Estimate
from tpuops.run.store import HangWatch
from tpuops.sop import claim, loader
from tpuops.sop.actions import Action, Command
from tpuops.sop.model import TEMPLATE, PlanContext, fill, fill_argv, suggest


def check_params(sop: loader.Sop, cfg: UserConfig, cwd: Path) -> list[str]:
    """`[params]` of tpuops.toml against the SOP being run. A name no SOP takes (this one, the user's or a
    built-in) is exit 2 with the file, line, key and the nearest known name; a name only other SOPs take is
    fine (the table serves every SOP): one note each, naming them. The notes are returned."""
    extra = [k for k in cfg.params if k not in sop.params]
    if not extra:
        return []
    takers: dict[str, list[str]] = {}
    for name, path in _every_sop(cwd).items():
        try:
            params = loader.load(path).params
        except UsageError:
            continue  # a broken SOP file is `tpuops sop list`'s to report, not this run's
        for p in params:
            takers.setdefault(p, []).append(name)
    notes = []
    for key in extra:
        if key in takers:
            notes.append(
                f"{cfg.param_at(key)}: [params] {key} is not a parameter of SOP {sop.name}, so this run does not "
                f"use it (SOP {', '.join(takers[key])} take{'s' if len(takers[key]) == 1 else ''} it)"
            )
            continue
        close = suggest(key, sop.params) or suggest(key, takers)
        raise UsageError(
            f"{cfg.param_at(key)}: [params] unknown parameter {key!r}{close}",
            hint=f"SOP {sop.name} takes {', '.join(sop.params) or 'none'}; `tpuops sop show NAME` lists any SOP's",
        )
    return notes


def _every_sop(cwd: Path) -> dict[str, Path]:
    """Every SOP file by name, the user's before the built-ins (as `tpuops sop list` finds them)."""
    found: dict[str, Path] = {}
    for d in loader.search_dirs(cwd):
        for f in sorted(d.glob("*.y*ml")) if d.is_dir() else []:
            found.setdefault(f.stem, f)
    return found


def preflight_argv(sop: loader.Sop, values: dict[str, object]) -> list[list[str]]:
    """Each preflight check's argv with the values in: a list parameter (the trainer overrides, `maps_to`
    values included) splices in as separate words, so the check sees exactly what the workers will get."""
    import sys

    scope = {**values, "local_python": sys.executable}
    return [fill_argv(check.argv, scope) for check in sop.preflight]


def check_trainer(sop: loader.Sop, values: dict[str, object]) -> None:
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


def fit_preflight(
    sop: loader.Sop,
    values: dict[str, object],
    accelerator: str | None,
    *,
    skip: bool,
    cwd: Path,
    zone: str | None = None,
    endpoint: str | None = None,
    slices: int = 1,
) -> tuple[str | None, Estimate | None]:
    """On a VM, before any SSH: the trainer config compiled for the VM's TPU type (cached). A config that
    does not fit stops here (exit 11); without libtpu on this machine one warning line and the run goes on.
    Returns the verdict line and the estimate a report compares the run with: the cost (dollars per step and
    per run in the VM's region, tpuops/cloud/pricing; the catalog at `endpoint` when given) and the predicted
    peak HBM per device."""
    if sop.fit is None or skip or not accelerator:
        return None, None
    from tpuops.checks import fit
    from tpuops.console import say as note  # fit and cost lines name their subject themselves

    config = fill(sop.fit.config, values)
    given = values.get(sop.fit.sets.strip("{}"), []) if sop.fit.sets else []
    sets = [str(s) for s in given] if isinstance(given, list | tuple) else []
    try:
        result = fit.check(config, sets, accelerator=accelerator, cwd=cwd, slices=slices)
    except fit.FitUnavailableError as e:
        note(f"fit: not checked ({e.message}); the run goes on (--skip-fit silences this)")
        return f"not checked: {e.message}", None
    fit.require_fit(result)
    line = fit.summary(result)
    note(f"fit: {line}{fit.cached_words(result, accelerator)}")
    result = fit.with_cost(result, zone, endpoint)
    if result["cost"]:
        from tpuops.cloud.pricing import cost_line

        note(cost_line(result["cost"]))
    elif unpriced := result.get("unpriced"):
        note(f"cost: no price: {unpriced['reason']}")
    peak = max((p["peak_bytes"] for p in result["phases"].values()), default=None)
    return line, {"config": config, "accelerator": accelerator, "cost": result["cost"], "peak_bytes": peak,
                  "tightest_phase": result["tightest_phase"]}  # fmt: skip


def context_defaults(
    params: Mapping[str, object],
    target: TargetSpec,
    cwd: Path,
    *,
    given: set[str],
    given_values: dict[str, object] | None = None,
    trainer: bool = False,
) -> dict[str, object]:
    """Defaults taken from where tpuops runs: the repository to sync is this checkout (locally, its path)
    at its HEAD commit; for a SOP of the bundled trainer (`trainer`) where no checkout holds `trainer/`, the
    trainer installed with tpuops (run/bundled). Parameters the user gave (`given`: --set or the config
    file) are not looked up."""
    found: dict[str, object] = {}
    env_given = given & {"venv", "python", "conda_env", "requirements", "install"}
    python = str(given_values.get("python", "")) if given_values else ""
    if "venv" in params and "venv" not in given and "/" in python:
        found["venv"] = "none"  # `--set python=/path/bin/python` alone: that interpreter as it is
    if "install" in params and "install" not in given:
        if "requirements" in given:
            found["install"] = "requirements"
        elif "repo_url" not in given and (layout := _layout(cwd)) is not None:
            found["install"] = layout  # what this checkout has (the workers check out the same commit)
    if target.kind == "local" and "venv" in params and not env_given:
        # Locally the trainer runs in this very interpreter (installed with the trainer extra): no new venv.
        import sys

        found.update({"venv": "none", "python": sys.executable})
    home_of = None
    if "repo_url" in params and "repo_url" not in given:
        if trainer and not _trainer_checkout(target, cwd):
            home_of = _bundled(params, target, given, found)
        else:
            _this_checkout(params, target, cwd, given, found)
    url = (given_values or {}).get("repo_url") if "repo_url" in given else found.get("repo_url")
    if url:  # one home per repository on a worker: its checkout and its environment (tree.repo_home)
        from tpuops.run.tree import repo_home

        home = repo_home(home_of or str(url))
        if "repo_dir" in params and "repo_dir" not in given:
            found["repo_dir"] = f"{home}/checkout"
        if "venv" in params and "venv" not in given and "venv" not in found:
            found["venv"] = f"{home}/venv"
    return found


def _this_checkout(
    params: Mapping[str, object], target: TargetSpec, cwd: Path, given: set[str], found: dict[str, object]
) -> None:
    """The repository to sync is this checkout (locally, its path) at its HEAD commit, which must be pushed."""
    url = (
        _git(cwd, "rev-parse", "--show-toplevel")
        if target.kind == "local"
        else _git(cwd, "remote", "get-url", "origin")
    )
    if not url and target.kind == "local" and (own := _own_checkout()) is not None:
        # Outside a checkout: the checkout tpuops itself runs from (its trainer/ is what runs locally).
        cwd, url = own, str(own)
    if not url:
        return
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


def _own_checkout() -> Path | None:
    """The git checkout tpuops itself runs from (an editable install), or None (a wheel's site-packages)."""
    root = Path(__file__).resolve().parents[2]
    top = _git(root, "rev-parse", "--show-toplevel")
    return root if top and Path(top).resolve() == root and (root / "trainer" / "main.py").is_file() else None


def _trainer_checkout(target: TargetSpec, cwd: Path) -> bool:
    """Whether a trainer SOP syncs a checkout as any SOP does: this one when it holds `trainer/` (tpuops
    itself, a fork), or locally outside any checkout the one tpuops runs from."""
    top = _git(cwd, "rev-parse", "--show-toplevel")
    if top:
        return (Path(top) / "trainer" / "main.py").is_file()
    return target.kind == "local" and _own_checkout() is not None


def _bundled(
    params: Mapping[str, object], target: TargetSpec, given: set[str], found: dict[str, object]
) -> str:
    """The trainer installed with tpuops as the repository to sync: locally its repository under the state
    home, on a VM the same sent as a git bundle; the commit is its one commit, its venv filled from its
    pyproject.toml. Returns the name its home on a worker is made from (one home for every version)."""
    from tpuops.run import bundled

    if "branch" in given:
        raise UsageError(
            "branch names a commit of repo_url, and no repository is named: the bundled trainer has one commit",
            hint="pass --set repo_url=URL with it, or leave out branch to run the trainer installed with tpuops",
        )
    made = bundled.make()
    found["repo_url"] = str(made.repo)
    if "branch" in params:
        found["branch"] = made.commit
    if "bundle" in params and "bundle" not in given and target.kind != "local":
        found["bundle"] = str(made.bundle)
    if "install" in params and not given & {"install", "requirements"}:
        found["install"] = "pyproject"
    return bundled.URL


def _layout(cwd: Path) -> str | None:
    """How python_env would fill a venv for this checkout's HEAD (`auto`'s order); None outside a checkout."""
    names = _git(cwd, "ls-tree", "--name-only", "HEAD", "--full-tree")
    if names is None:
        return None
    files = set(names.splitlines())
    if "uv.lock" in files:
        return "uv"
    if files & {"pyproject.toml", "setup.py"}:
        return "pyproject"
    if "requirements.txt" in files:
        return "requirements"
    return None


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

    ctx = plan_context(values, cwd)
    found = [cwd / ".env", *(s.local_path(ctx) for s in sop.steps if isinstance(s, SyncEnv))]
    return sorted({str(p.resolve()) for p in found})


def check_env_files(sop: loader.Sop, values: dict[str, object], given: set[str], cwd: Path) -> None:
    """Every .env a sync_env step would send parses and can be written (exit 2 otherwise); one named with
    --set (or tpuops.toml, or `required: true`) must exist: a typo must not leave a stale .env in use."""
    from tpuops.config import secrets
    from tpuops.sop.steps import SyncEnv

    ctx = plan_context(values, cwd)
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
    return plan_context(values).raw(step.runs_dir) if step else str(values.get("runs_dir", "~/tpuops/runs"))


def plan_context(values: dict[str, object], cwd: Path | None = None) -> PlanContext:
    """Worker 0's plan context: for the step fields that are the same on every worker."""
    return PlanContext(worker=0, num_workers=1, run_id="", values=values, local_dir=cwd or Path.cwd())


# Room kept in each step's command for what differs between this check and the run: the run id in the step's own
# paths (planned here as DRY-RUN), a worker's number. The run lock's guard around the step is counted exactly.
COMMAND_SLACK = 1024


def check_command_sizes(sop: loader.Sop, title: str, actions: list[Action]) -> None:
    """A step command longer than a worker's shell takes as one argument (shell.MAX_COMMAND_BYTES) is bad input,
    refused before anything runs (exit 2 naming both sizes), not a start that fails after the sync."""
    rid = "20260101-000000-" + "x" * 24  # a run id's length (run/launch.new_run_id) and then some
    limit = shell.MAX_COMMAND_BYTES - COMMAND_SLACK
    for a in actions:
        if not isinstance(a, Command):
            continue
        size = shell.command_bytes(claim.guarded(rid, f"step {title} of run {rid}", a.script))
        if size > limit:
            raise UsageError(
                f"SOP {sop.name}, step {title}: its command is {size:,} bytes, over the {limit:,} a step may send to "
                f"a worker (one argument of its shell: at most {shell.MAX_COMMAND_BYTES:,} bytes, Linux's "
                f"MAX_ARG_STRLEN of 128 KiB, less {COMMAND_SLACK:,} for what the run adds); nothing was run",
                hint="put the long part in a script or a config file in your repository and run that",
            )


def hang_watch(sop: loader.Sop, values: dict[str, object], cwd: Path) -> HangWatch | None:
    """The run's follow step's hang watch (hang_factor, hang_min_s, hang_warmup, on_hang) as it runs: the run
    record keeps it, so `tpuops attach` watches for a hang as the run's own follow did. None without a follow."""
    from tpuops.logs.actions import Follow

    ctx = plan_context(values, cwd)
    for step in sop.steps:
        if step.kind == "follow":
            for action in step.plan(ctx):
                if isinstance(action, Follow):
                    return {
                        "hang_factor": action.hang_factor,
                        "hang_min_s": action.hang_min_s,
                        "hang_warmup": action.hang_warmup,
                        "on_hang": action.on_hang,
                        "poll_s": action.poll_s,
                    }
    return None
