"""What the user asked for: tpuops.toml (project, then ~/.config/tpuops/config.toml), the target options
they default (TargetSpec), and the state home with its atomic writes."""

from __future__ import annotations

import difflib
import os
import re
import tempfile
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
    for path in config_paths(cwd):
        if not path.is_file():
            continue
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{path}: invalid TOML: {e}") from None
        _check_keys(path, data)
        _check_values(path, data)
        params = {**merged["params"], **data.get("params", {})}
        merged.update(data)
        merged["params"] = params
    return UserConfig(**merged)


def _check_keys(path: Path, data: dict[str, Any]) -> None:
    valid = [f.name for f in fields(UserConfig)]
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"{path}: unknown key {key!r}{hint}", hint=f"valid keys: {', '.join(valid)}")


def _check_values(path: Path, data: dict[str, Any]) -> None:
    """Names by the API's rules, numbers by sign and finiteness (tpuops.validators), before anything runs."""
    from tpuops import validators

    for kind in ("vm", "zone", "project"):
        if kind in data:
            validators.name(kind, data[kind], f"{path}: {kind}")
    if "parallel" in data:
        validators.number(data["parallel"], f"{path}: parallel", minimum=1, above=False, integer=True)
    if "unreachable_s" in data:
        validators.number(data["unreachable_s"], f"{path}: unreachable_s", minimum=1, above=False)
    if "key_ttl_s" in data:
        validators.number(data["key_ttl_s"], f"{path}: key_ttl_s")


@dataclass(frozen=True)
class TargetSpec:
    """Where to run. Exactly one of: local (default), hosts, vm."""

    local: bool = False
    local_workers: int = 1
    hosts: tuple[str, ...] = ()
    hostkeys: tuple[str, ...] = ()
    user: str | None = None
    identity: str | None = None
    vm: str | None = None
    zone: str | None = None
    project: str | None = None
    internal_ip: bool = False
    api_endpoint: str | None = None
    connect_timeout: float = 10.0
    tunnel_through_iap: bool = False
    key_push: bool = True  # False: never change a VM's ssh-keys metadata (fail when the key is missing)
    key_ttl_s: float | None = None  # OS Login: the imported key expires after this long

    @property
    def kind(self) -> str:
        if self.vm:
            return "vm"
        return "ssh" if self.hosts else "local"

    def with_defaults(self, cfg: UserConfig) -> TargetSpec:
        """Fill what the user left out from the config file (an explicit --local or --host wins)."""
        vm = self.vm or (None if self.local or self.hosts else cfg.vm)
        return TargetSpec(
            local=self.local,
            local_workers=self.local_workers,
            hosts=self.hosts,
            hostkeys=self.hostkeys,
            user=self.user or cfg.user,
            identity=self.identity or cfg.identity,
            vm=vm,
            zone=self.zone or cfg.zone,
            project=self.project or cfg.project,
            internal_ip=self.internal_ip or cfg.internal_ip,
            api_endpoint=self.api_endpoint or cfg.api_endpoint,
            connect_timeout=self.connect_timeout,
            tunnel_through_iap=self.tunnel_through_iap or cfg.tunnel_through_iap,
            key_push=self.key_push and cfg.key_push,
            key_ttl_s=self.key_ttl_s or cfg.key_ttl_s,
        )


def write_atomic(path: str | Path, text: str) -> None:
    """Replace `path` with `text` whole or not at all: a unique temporary name in the same folder, fsync, then
    rename. A reader never sees half a run record or cache file, whatever kills the writer (a temporary file is
    left behind at worst, under a name no reader looks at); two writers never share a temporary name."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        Path(tmp).replace(target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def target_from_options(
    *,
    vm: str | None = None,
    zone: str | None = None,
    project: str | None = None,
    host: list[str] | None = None,
    hostkey: list[str] | None = None,
    user: str | None = None,
    identity: str | None = None,
    local: bool = False,
    local_workers: int = 1,
    internal_ip: bool = False,
    api_endpoint: str | None = None,
    tunnel_through_iap: bool = False,
    no_key_push: bool = False,
    key_ttl: str | None = None,
) -> TargetSpec:
    """The target options as typed (`--vm`, `--host`, `--key-ttl 12h`, ...) -> a checked TargetSpec."""
    chosen = [name for name, on in (("--vm", vm), ("--host", host), ("--local", local)) if on]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} were both given: choose one target")
    if hostkey and not (host or vm):
        raise UsageError("--hostkey needs --host or --vm (with --vm it overrides the guest-attribute keys)")
    return TargetSpec(
        local=local,
        local_workers=local_workers,
        hosts=tuple(host or ()),
        hostkeys=tuple(hostkey or ()),
        user=user,
        identity=identity,
        vm=vm,
        zone=zone,
        project=project,
        internal_ip=internal_ip,
        api_endpoint=api_endpoint,
        tunnel_through_iap=tunnel_through_iap,
        key_push=not no_key_push,
        key_ttl_s=parse_duration("--key-ttl", key_ttl) if key_ttl else None,
    )


def parse_sets(sets: list[str] | None) -> dict[str, str]:
    """`key=value` strings -> dict; the value is kept verbatim (it is quoted wherever it is used)."""
    out: dict[str, str] = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set {item!r} is not key=value", hint="for example --set steps=20")
        out[key.strip()] = value
    return out


def parse_duration(option: str, text: str) -> float:
    """`90`, `30m`, `12h`, `7d` -> seconds."""
    m = re.fullmatch(r"(\d+)([smhd]?)", text.strip())
    if not m or int(m.group(1)) == 0:
        raise UsageError(f"{option} {text!r} is not a duration", hint="for example 3600, 30m, 12h or 7d")
    return int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
