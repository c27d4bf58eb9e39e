"""Where to run (TargetSpec): the target options as typed, checked, and filled from tpuops.toml."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpuops.config.model import UserConfig
from tpuops.errors import UsageError


def _given(*values: bool | None, default: bool) -> bool:
    """The first value that was given (not None), else the default."""
    return next((v for v in values if v is not None), default)


@dataclass(frozen=True)
class TargetSpec:
    """Where to run. Exactly one of: local (default), hosts, vm. The shared settings (TargetSettings) are None
    when not given; `with_defaults` fills them from the config and the defaults."""

    local: bool = False
    local_workers: int = 1
    hosts: tuple[str, ...] = ()
    hostkey: tuple[str, ...] = ()  # --hostkey, one fingerprint per host
    user: str | None = None
    identity: str | None = None
    vm: str | None = None
    zone: str | None = None
    project: str | None = None
    internal_ip: bool | None = None
    api_endpoint: str | None = None
    connect_timeout: float = 10.0
    tunnel_through_iap: bool | None = None
    key_push: bool | None = (
        None  # False: never change a VM's ssh-keys metadata (fail when the key is missing)
    )
    key_ttl: float | None = None  # OS Login: the imported key expires after this long

    @property
    def kind(self) -> str:
        if self.vm:
            return "vm"
        return "ssh" if self.hosts else "local"

    def with_defaults(self, cfg: UserConfig) -> TargetSpec:
        """Fill what the user left out from the config file (an explicit --local or --host wins; a flag given
        either way wins over the file)."""
        vm = self.vm or (None if self.local or self.hosts else cfg.vm)
        return TargetSpec(
            local=self.local,
            local_workers=self.local_workers,
            hosts=self.hosts,
            hostkey=self.hostkey,
            user=self.user or cfg.user,
            identity=self.identity or cfg.identity,
            vm=vm,
            zone=self.zone or cfg.zone,
            project=self.project or cfg.project,
            internal_ip=_given(self.internal_ip, cfg.internal_ip, default=False),
            api_endpoint=self.api_endpoint or cfg.api_endpoint,
            connect_timeout=self.connect_timeout,
            tunnel_through_iap=_given(self.tunnel_through_iap, cfg.tunnel_through_iap, default=False),
            key_push=_given(self.key_push, cfg.key_push, default=True),
            key_ttl=self.key_ttl or cfg.key_ttl,
        )


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
    internal_ip: bool | None = None,
    api_endpoint: str | None = None,
    tunnel_through_iap: bool | None = None,
    key_push: bool | None = None,
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
        hostkey=tuple(hostkey or ()),
        user=user,
        identity=identity,
        vm=vm,
        zone=zone,
        project=project,
        internal_ip=internal_ip,
        api_endpoint=api_endpoint,
        tunnel_through_iap=tunnel_through_iap,
        key_push=key_push,
        key_ttl=parse_duration("--key-ttl", key_ttl) if key_ttl else None,
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
