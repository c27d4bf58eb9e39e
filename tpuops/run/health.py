"""`tpuops doctor` on a target resolved as a run resolves it, looking where a run would (the same SOP params)."""

from __future__ import annotations

from pathlib import Path

from tpuops.checks import doctor
from tpuops.checks.doctor import WorkerHealth
from tpuops.config import TargetSpec
from tpuops.config import load as load_config
from tpuops.errors import UsageError
from tpuops.run.prepare import context_defaults
from tpuops.run.target import open_transport, resolve
from tpuops.shell import Redactor
from tpuops.sop import loader

SOP = "grpo"  # the SOP whose parameters (repo_dir, lockfile, env_file) say where a run keeps things


def examine(
    spec: TargetSpec,
    *,
    sets: dict[str, str] | None = None,
    env_file: str | None = None,
    remote_env: str | None = None,
    lockfile: str | None = None,
    cwd: Path,
) -> list[WorkerHealth]:
    """Every worker's health against the local .env (tpuops.toml's defaults apply to the target). Paths not
    given come from the run's SOP parameters: --set, then tpuops.toml's `params`, then the SOP's defaults."""
    cfg = load_config(cwd)
    params = loader.load(loader.find(SOP, loader.search_dirs(cwd))).params
    given = {**cfg.params, **(sets or {})}
    # Where this checkout's runs keep things on a worker (its repository's own home), as a run would derive it.
    try:
        found = context_defaults(params, spec.with_defaults(cfg), cwd, given=set(given), given_values=given)
    except UsageError:  # an unpushed HEAD stops a run, not a look at the workers
        found = {}

    def value(name: str) -> str:
        return str(given[name] if name in given else found.get(name, params[name].default))

    local = Path(env_file or value("env_file")).expanduser()
    local_values = doctor.local_env(local if local.is_absolute() else cwd / local)
    redact = Redactor(local_values.values())
    transport = open_transport(resolve(spec, cfg), redact)
    try:
        return doctor.examine(
            transport,
            local_values,
            remote_env=remote_env or f"{value('repo_dir').rstrip('/')}/.env",
            lockfile=lockfile or value("lockfile"),
            redact=redact,
            coordinator_port=int(value("coordinator_port")),
        )
    finally:
        transport.close()


exit_code = doctor.exit_code
