"""Turn --local / --host / --vm options into a Transport (the only place that picks one)."""

from __future__ import annotations

import re
from pathlib import Path

from tpuops.config import TargetSpec, state_home
from tpuops.errors import UsageError
from tpuops.shell import Redactor
from tpuops.transport.base import Transport, Worker

_HOST = re.compile(
    r"^(?:(?P<user>[^@\s]+)@)?(?P<host>[A-Za-z0-9_.\-]+|\[[0-9a-fA-F:]+\])(?::(?P<port>\d+))?$"
)
_FP = re.compile(r"^SHA256:[A-Za-z0-9+/]{43}$")


def parse_hosts(hosts: tuple[str, ...], hostkeys: tuple[str, ...], user: str | None) -> list[Worker]:
    for fp in hostkeys:
        if not _FP.match(fp):
            raise UsageError(
                f"--hostkey {fp!r} is not an OpenSSH SHA256 fingerprint",
                hint="expected SHA256: followed by 43 base64 characters, as `ssh-keygen -lf KEY.pub` prints",
            )
    if hostkeys and len(hostkeys) != len(hosts):
        raise UsageError(
            f"got {len(hostkeys)} --hostkey for {len(hosts)} --host: give one per host, in order"
        )
    workers = []
    for k, h in enumerate(hosts):
        m = _HOST.match(h)
        if not m:
            raise UsageError(
                f"--host {h!r} is not user@host[:port]", hint="for example --host me@10.0.0.2:22"
            )
        workers.append(
            Worker(
                index=k,
                host=m["host"].strip("[]"),
                port=int(m["port"] or 22),
                user=m["user"] or user,
                hostkey=hostkeys[k] if hostkeys else None,
            )
        )
    return workers


def open_transport(spec: TargetSpec, redact: Redactor | None = None) -> Transport:
    redact = redact or Redactor()
    if spec.kind == "local":
        from tpuops.transport.local import LocalTransport

        return LocalTransport(state_home() / "local", num_workers=spec.local_workers, redact=redact)
    prepare = None
    accelerator = None
    if spec.kind == "vm":
        from tpuops.cloud.locate import reach

        found = reach(spec)
        workers, prepare, accelerator = found.workers, found.prepare, found.vm.accelerator_type
    else:
        workers = parse_hosts(spec.hosts, spec.hostkeys, spec.user)
    from tpuops.transport.ssh import SshTransport

    transport = SshTransport(
        workers,
        known_hosts=state_home() / "known_hosts",
        identity=Path(spec.identity).expanduser() if spec.identity else None,
        connect_timeout=spec.connect_timeout,
        redact=redact,
        prepare=prepare,
    )
    transport.accelerator = accelerator  # the VM's TPU type (the fit preflight); None for --host
    return transport


def select_workers(selector: str, count: int) -> list[int]:
    """`all`, `0`, or `0,2` -> worker indices, checked against the VM's worker count."""
    if selector == "all":
        return list(range(count))
    try:
        chosen = sorted({int(part) for part in selector.split(",")})
    except ValueError:
        raise UsageError(f"--worker {selector!r}: expected all, a number or a list like 0,2") from None
    bad = [w for w in chosen if not 0 <= w < count]
    if bad:
        raise UsageError(f"--worker {selector!r}: this target has workers 0..{count - 1}, received {bad}")
    return chosen
