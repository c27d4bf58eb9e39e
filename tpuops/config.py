"""User configuration (tpuops.toml in the project, then ~/.config/tpuops/config.toml) and tpuops' state home."""

from __future__ import annotations

import difflib
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tpuops.errors import UsageError


@dataclass(frozen=True)
class UserConfig:
    """Defaults so short commands work. `params` are SOP parameter defaults (repo_url, branch, ...)."""

    project: str | None = None
    zone: str | None = None
    vm: str | None = None
    user: str | None = None
    identity: str | None = None
    parallel: int = 16
    internal_ip: bool = False
    tunnel_through_iap: bool = False
    key_push: bool = True
    key_ttl_s: float | None = None
    unreachable_s: float = 300.0  # a VM none of whose workers answers on SSH this long is lost (exit 8)
    api_endpoint: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # which files were read, for `tpuops config`


def state_home() -> Path:
    """Where tpuops keeps known_hosts, local run copies and the local transport's scratch root."""
    return Path(os.environ.get("TPUOPS_HOME") or Path.home() / ".tpuops")


def config_paths(cwd: Path | None = None) -> list[Path]:
    """The files read, lowest precedence first: the user file, then the nearest project tpuops.toml."""
    cwd = cwd or Path.cwd()
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    paths = [xdg / "tpuops" / "config.toml"]
    project = next((d / "tpuops.toml" for d in [cwd, *cwd.parents] if (d / "tpuops.toml").is_file()), None)
    return [*paths, project] if project else paths


def load(cwd: Path | None = None) -> UserConfig:
    """Merge the project file over the user file; unknown keys are errors naming the closest valid key."""
    merged: dict[str, Any] = {"params": {}}
    sources: list[str] = []
    for path in config_paths(cwd):
        if not path.is_file():
            continue
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{path}: invalid TOML: {e}") from None
        _check_keys(path, data)
        params = {**merged["params"], **data.get("params", {})}
        merged.update(data)
        merged["params"] = params
        sources.append(str(path))
    return UserConfig(**merged, source=", ".join(sources))


def _check_keys(path: Path, data: dict[str, Any]) -> None:
    valid = [f.name for f in fields(UserConfig) if f.name != "source"]
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"{path}: unknown key {key!r}{hint}", hint=f"valid keys: {', '.join(valid)}")
