"""The one schema of the user's settings: tpuops.toml's keys (UserConfig) and the target settings its CLI flags share."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr


class TargetSettings(BaseModel):
    """The target settings tpuops.toml and the CLI's target options share, one name each. None means "not
    given": a flag given either way (`--internal-ip` / `--no-internal-ip`) wins over the file, the file over
    the default. Strict: a file's `internal_ip = "no"` is an error, not a true string."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    vm: str | None = None
    zone: str | None = None
    project: str | None = None
    user: str | None = None
    identity: str | None = None
    api_endpoint: str | None = None
    internal_ip: bool | None = None  # connect to the workers' internal IPs
    tunnel_through_iap: bool | None = None
    key_push: bool | None = None  # False: never change a VM's ssh-keys metadata (default True)
    key_ttl: float | None = Field(default=None, gt=0)  # OS Login: the imported key expires after this (s)


class UserConfig(TargetSettings):
    """tpuops.toml (the project's over the user's): target defaults, and `params`, SOP parameter defaults
    (repo_url, branch, ...), so short commands work."""

    parallel: int = Field(default=16, ge=1)
    unreachable_s: float = Field(
        default=300.0, gt=0
    )  # a VM none of whose workers answers on SSH this long is lost
    sops_dir: str | None = None  # the user's SOP folder, relative to the tpuops.toml that names it
    api: Literal["tpu", "compute"] | None = None  # `vm create`'s API for v5e/v5p/v6e (TPU7x: always compute)
    params: dict[str, object] = Field(default_factory=dict)
    # Where each `params` key was set, `file:line` (the file that won): what a [params] error points at.
    _params_at: dict[str, str] = PrivateAttr(default_factory=dict)

    def param_at(self, key: str) -> str:
        """`file:line` of a [params] key (`tpuops.toml` when the config was not read from a file)."""
        return self._params_at.get(key, "tpuops.toml")
