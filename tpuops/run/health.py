"""`tpuops doctor` on a target resolved as a run resolves it, looking where a run would (the same SOP params)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from tpuops.checks import doctor
from tpuops.checks.doctor import WorkerHealth
from tpuops.config import TargetSpec
from tpuops.config import load as load_config
from tpuops.errors import UsageError
from tpuops.run.prepare import context_defaults
from tpuops.run.target import open_transport, resolve
from tpuops.shell import Redactor
from tpuops.sop import loader, ports
from tpuops.sop.actions import Command
from tpuops.sop.homes import Home
from tpuops.sop.model import PlanContext
from tpuops.transport.base import Transport

SOP = "grpo"  # the SOP whose parameters (repo_dir, lockfile, env_file) say where a run keeps things


def examine(
    spec: TargetSpec,
    *,
    sets: dict[str, str] | None = None,
    env_file: str | None = None,
    remote_env: str | None = None,
    lockfile: str | None = None,
    cwd: Path,
) -> Doctored:
    """Every worker's health against the local .env (tpuops.toml's defaults apply to the target), and each
    repository's home on the workers reached. Paths not given come from the run's SOP parameters: --set, then
    tpuops.toml's `params`, then the SOP's defaults."""
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
        health = doctor.examine(
            transport,
            local_values,
            remote_env=remote_env or f"{value('repo_dir').rstrip('/')}/.env",
            lockfile=lockfile or value("lockfile"),
            redact=redact,
            coordinator=functools.partial(_coordinator, transport, int(value("coordinator_port"))),
        )
        found_homes = [x for h in health if h.connected for x in _homes(transport, h.worker)]
    finally:
        transport.close()
    doctor.add_fixes(health, target_words(spec))
    return Doctored(health, found_homes)


@dataclass(frozen=True)
class Doctored:
    """What `tpuops doctor` found: each worker's health (checks/doctor.py) and each repository's home on the
    workers it reached (sop/homes.py); run/ puts the two together, as neither room imports the other."""

    workers: list[WorkerHealth]
    homes: list[Home]

    @property
    def code(self) -> int:
        return doctor.exit_code(self.workers)


def _homes(transport: Transport, w: int) -> list[Home]:
    from tpuops.errors import TpuopsError
    from tpuops.sop.homes import homes

    try:
        return homes(transport, w)
    except TpuopsError:  # a worker lost meanwhile: its health already says what doctor could read
        return []


def target_words(spec: TargetSpec) -> str:
    """The options that name `spec` again in a command to copy (`--vm NAME --zone ZONE`, `--host ...`)."""
    import shlex

    if spec.vm:
        words = ["--vm", spec.vm, *(["--zone", spec.zone] if spec.zone else [])]
        words += ["--project", spec.project] if spec.project else []
    elif spec.hosts:
        keys = [*spec.hostkey, *[""] * len(spec.hosts)]
        words = [
            w
            for h, k in zip(spec.hosts, keys, strict=False)
            for w in ("--host", h, *(("--hostkey", k) if k else ()))
        ]
    else:
        return "--local"
    return shlex.join(words + (["--identity", spec.identity] if spec.identity else []))


def _coordinator(transport: Transport, port: int, w: int) -> tuple[str, bool] | None:
    """The run's own coordinator-port check on worker w (sop/ports.py): what it found, and whether that is fine;
    None on one worker (nothing to reach)."""
    n = len(transport.workers)
    ctx = PlanContext(w, n, "doctor", {}, coordinator_host=ports.coordinator_host(transport.workers, w))
    for cmd in ports.check(ctx, port):
        assert isinstance(cmd, Command)
        found = ports.verdict([transport.run(w, cmd.script, timeout=cmd.timeout)])
        return found.detail, found.status == "ok"
    return None


def clean(spec: TargetSpec, *, older_than_s: int | None, cwd: Path) -> list[Home]:
    """Each worker's homes not in use removed (with `older_than_s`: only those unused that long), the others
    named with why they stay; every worker at once. A worker not reached fails the command (its error)."""
    from concurrent.futures import ThreadPoolExecutor

    from tpuops.sop.homes import homes

    transport = open_transport(resolve(spec, load_config(cwd)), Redactor())
    try:

        def one(w: int) -> list[Home]:
            transport.connect(w)
            return homes(transport, w, remove=True, older_than_s=older_than_s)

        with ThreadPoolExecutor(max_workers=16) as pool:
            done = list(pool.map(one, range(len(transport.workers))))
    finally:
        transport.close()
    return [h for per in done for h in per]
