"""`tpuops doctor` on a target resolved as a run resolves it: checks/doctor asks each worker over its transport."""

from __future__ import annotations

from pathlib import Path

from tpuops.checks import doctor
from tpuops.checks.doctor import WorkerHealth
from tpuops.config import TargetSpec
from tpuops.config import load as load_config
from tpuops.run.target import open_transport, resolve
from tpuops.shell import Redactor


def examine(
    spec: TargetSpec, *, env_file: Path, remote_env: str, lockfile: str, cwd: Path
) -> list[WorkerHealth]:
    """Every worker's health against the local .env (tpuops.toml's defaults apply to the target)."""
    local_values = doctor.local_env(env_file)
    redact = Redactor(local_values.values())
    transport = open_transport(resolve(spec, load_config(cwd)), redact)
    try:
        return doctor.examine(
            transport, local_values, remote_env=remote_env, lockfile=lockfile, redact=redact
        )
    finally:
        transport.close()


exit_code = doctor.exit_code
