"""Shared CLI options as Annotated aliases, and the one function that turns them into a TargetSpec."""

from __future__ import annotations

import re
from typing import Annotated

import typer

from tpuops.config import TargetSpec
from tpuops.errors import UsageError

VmOpt = Annotated[str | None, typer.Option("--vm", help="TPU VM name (found through the TPU API).")]
ZoneOpt = Annotated[str | None, typer.Option("--zone", help="Zone of the VM; searched when omitted.")]
ProjectOpt = Annotated[str | None, typer.Option("--project", help="Google Cloud project.")]
HostOpt = Annotated[
    list[str] | None,
    typer.Option("--host", help="Direct SSH target user@ip[:port], one per worker (repeatable)."),
]
HostKeyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--hostkey", help="Pinned host key SHA256:... per worker, in order (overrides a VM's own keys)."
    ),
]
UserOpt = Annotated[str | None, typer.Option("--user", help="SSH user (default: from --host or config).")]
IdentityOpt = Annotated[str | None, typer.Option("--identity", "-i", help="SSH private key file.")]
LocalOpt = Annotated[
    bool, typer.Option("--local", help="Run on this machine (the default without --vm/--host).")
]
LocalWorkersOpt = Annotated[
    int, typer.Option("--local-workers", min=1, help="Simulated workers for --local (scratch roots).")
]
WorkerOpt = Annotated[str, typer.Option("--worker", "-w", help="Workers to use: all, 0, or 0,2.")]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="Parameter override key=value (repeatable).")
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Machine-readable report on stdout; people's output on stderr.")
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the exact per-worker plan; touch nothing.")]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Stop processes holding the TPU before clearing its lock.")
]
KeepGoingOpt = Annotated[
    bool, typer.Option("--keep-going", help="Continue on the other workers after a failure.")
]
ParallelOpt = Annotated[
    int | None, typer.Option("--parallel", min=1, help="Workers handled at once (default 16).")
]
RecoverOpt = Annotated[
    bool,
    typer.Option("--recover", help="Watch the VM; on preemption recreate it and resume from the checkpoint."),
]
MaxRecoveriesOpt = Annotated[
    int, typer.Option("--max-recoveries", min=0, help="Recoveries before giving up.")
]
SkipFitOpt = Annotated[
    bool,
    typer.Option(
        "--skip-fit", help="On a VM, start without compiling the config for its TPU first (tpuops fit)."
    ),
]
UnreachableOpt = Annotated[
    float | None,
    typer.Option(
        "--unreachable-s",
        min=1.0,
        help="Seconds no worker of the VM answers on SSH before it counts as lost (default 300, or "
        "unreachable_s in tpuops.toml).",
    ),
]
InternalIpOpt = Annotated[bool, typer.Option("--internal-ip", help="Connect to workers' internal IPs.")]
TunnelOpt = Annotated[
    bool,
    typer.Option(
        "--tunnel-through-iap", help="Reach workers through IAP TCP tunnels (automatic without external IPs)."
    ),
]
NoKeyPushOpt = Annotated[
    bool, typer.Option("--no-key-push", help="Never add your key to a VM's ssh-keys metadata.")
]
KeyTtlOpt = Annotated[
    str | None,
    typer.Option("--key-ttl", help="OS Login: the imported key expires after this (30m, 12h, 7d)."),
]
ApiEndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--api-endpoint", envvar="TPUOPS_TPU_API", help="TPU API endpoint (e.g. the local emulator)."
    ),
]


def parse_sets(sets: list[str] | None) -> dict[str, str]:
    """`key=value` strings -> dict; the value is kept verbatim (it is quoted wherever it is used)."""
    out: dict[str, str] = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set {item!r} is not key=value", hint="for example --set steps=20")
        out[key.strip()] = value
    return out


def target(
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


def parse_duration(option: str, text: str) -> float:
    """`90`, `30m`, `12h`, `7d` -> seconds."""
    m = re.fullmatch(r"(\d+)([smhd]?)", text.strip())
    if not m or int(m.group(1)) == 0:
        raise UsageError(f"{option} {text!r} is not a duration", hint="for example 3600, 30m, 12h or 7d")
    return int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
