"""--local / --host / --vm resolved once per command into a Target, and the Transport that reaches it."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuops.config import TargetSpec, UserConfig, state_home
from tpuops.errors import ConnectError, TpuopsError, UsageError
from tpuops.run.store import RouteRecord, WorkerRoute, record_route
from tpuops.shell import Redactor
from tpuops.transport.base import Transport, Worker

# Only a VM target loads the cloud modules (`resolve` imports them then): --host/--local runs never do.
if TYPE_CHECKING:
    from tpuops.cloud.client import Api
    from tpuops.cloud.locate import Reach
    from tpuops.cloud.tpu_api import VmInfo

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


@dataclass(frozen=True)
class Target:
    """Where a command runs, resolved once at its start and passed down (launch, recovery, the fit preflight,
    the transport): the spec with the config's defaults applied, the config itself, and the workers with
    their hosts, users and pinned host keys. On a VM also `reach`: the VM as the TPU API described it, its
    guest attributes, the route and the API client (the recovery watch reuses it). A recreated VM is
    resolved again; nothing else asks the TPU API for the VM a second time."""

    spec: TargetSpec
    config: UserConfig
    workers: tuple[Worker, ...] = ()  # empty for --local (the local transport numbers its own workers)
    reach: Reach | None = None

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def vm(self) -> VmInfo | None:
        return self.reach.vm if self.reach else None

    @property
    def api(self) -> Api | None:
        return self.reach.api if self.reach else None

    def read_only(self) -> Target:
        """This target as a dry run reaches it: its first connection changes nothing on the VM (no key made,
        added to the metadata or imported into OS Login; workers that would need one are not read)."""
        if self.reach is None:
            return self
        return dataclasses.replace(self, reach=dataclasses.replace(self.reach, read_only=True))

    @property
    def accelerator(self) -> str | None:
        """The VM's TPU type (the fit preflight, the out-of-memory hint); None for --host and --local."""
        return self.reach.vm.accelerator_type if self.reach else None


def resolve(
    spec: TargetSpec,
    cfg: UserConfig | None = None,
    notify: Callable[[str], None] | None = None,
    *,
    api: Api | None = None,
) -> Target:
    """The one place a target is resolved. `cfg` is the config the command loaded (None: a spec that is
    complete already, such as a run record's). A VM costs one get_node and one guest-attributes call (and
    the zone search when no zone is given or cached); `api` reuses a client (a recovery's re-resolve)."""
    cfg = cfg or UserConfig()
    spec = spec.with_defaults(cfg)
    if spec.kind == "local":
        return Target(spec, cfg)
    if spec.kind == "ssh":
        return Target(spec, cfg, tuple(parse_hosts(spec.hosts, spec.hostkey, spec.user)))
    from tpuops.cloud.locate import reach

    found = reach(spec, notify, api)
    return Target(spec, cfg, tuple(found.workers), found)


def keep_route(run_id: str, target: Target, transport: Transport) -> None:
    """Once a VM run's connections are up: how it logged in (each worker's address, user and pinned host key,
    its key, the route, the VM as resolved) kept in its record, so attach, logs, stop and report log in the same
    way without asking a cloud API (`reach_again`). Nothing to keep for --host and --local (their spec is all)."""
    from tpuops.transport.ssh import SshTransport

    reach = target.reach
    if reach is None or not isinstance(transport, SshTransport) or transport.identity is None:
        return
    by_index = {w.index: w for w in transport.workers}  # as logged in: the users OS Login or the key gave
    kept = [
        dataclasses.replace(w, user=by_index[w.index].user if w.index in by_index else w.user)
        for w in reach.workers  # their own addresses (through IAP the transport's are the tunnels')
    ]
    tunnel_to: list[str] = []
    if reach.route == "iap":
        from tpuops.cloud.locate import instance_names

        tunnel_to = instance_names(reach.vm, reach.attrs)
    route: RouteRecord = {
        "via": reach.route, "workers": [_worker_route(w) for w in kept], "identity": str(transport.identity),
        "vm": reach.vm.to_dict(), "instances": tunnel_to,
    }  # fmt: skip
    record_route(run_id, route)


def _worker_route(w: Worker) -> WorkerRoute:
    return {
        "index": w.index, "host": w.host, "port": w.port, "user": w.user, "hostkey": w.hostkey,
        "internal_host": w.internal_host, "slice_index": w.slice_index, "peer_host": w.peer_host,
    }  # fmt: skip


def from_route(spec: TargetSpec, route: RouteRecord, notify: Callable[[str], None] | None = None) -> Target:
    """A VM run's target as its record keeps it (`keep_route`): no cloud API call."""
    from tpuops.cloud.locate import reach_recorded

    workers = [
        Worker(w["index"], w["host"], w["port"], w["user"], w["hostkey"], internal_host=w["internal_host"],
               slice_index=w["slice_index"], peer_host=w["peer_host"])
        for w in route["workers"]
    ]  # fmt: skip
    key = Path(route["identity"] or spec.identity or "").expanduser()
    found = reach_recorded(spec, route["vm"], route["via"], workers, key, tuple(route["instances"]), notify)
    return Target(spec, UserConfig(), tuple(workers), found)


def reach_again(
    spec: TargetSpec,
    route: RouteRecord | None,
    workers: list[int],
    redact: Redactor | None = None,
    notify: Callable[[str], None] | None = None,
) -> tuple[Target, Transport]:
    """A run's workers reached again (attach, logs, stop, report, `tpuops runs`): by the route the run logged in
    by, with no cloud API call; the VM is resolved through the cloud APIs (once) only when that route fails: a
    refused or timed-out connection, a changed host key, a refused login. Returns the target and a transport
    whose `workers` are connected (the route's) or not yet (a resolved one connects on first use)."""
    if route is not None and spec.kind == "vm":
        target = from_route(spec, route, notify)
        transport = open_transport(target, redact)
        failed = _connect_once(transport, workers)
        if failed is None:
            return target, transport
        transport.close()
        if notify is None:
            from tpuops.console import note

            notify = note
        notify(f"{spec.vm}: the run's recorded route failed ({failed.line()}); looking the VM up again")
    target = resolve(spec, notify=notify)
    return target, open_transport(target, redact)


def _connect_once(transport: Transport, workers: list[int]) -> ConnectError | None:
    """Every worker connected, each tried once (a dead route is not tried again: the API is asked instead);
    the first failure, if any."""
    from tpuops.transport.ssh import SshTransport

    retries = transport.connect_retries if isinstance(transport, SshTransport) else 0
    if isinstance(transport, SshTransport):
        transport.connect_retries = 1
    try:
        connect_all(transport, workers, len(workers), keep_going=False)
    except ConnectError as e:
        return e
    finally:
        if isinstance(transport, SshTransport):
            transport.connect_retries = retries  # a reconnect during a long follow: as any transport's
    return None


def open_transport(target: Target, redact: Redactor | None = None) -> Transport:
    """The transport for a resolved target; nothing is connected yet (a VM's key and tunnels wait for the
    first connection: `Reach.prepare`)."""
    redact = redact or Redactor()
    spec = target.spec
    if spec.kind == "local":
        from tpuops.transport.local import LocalTransport

        return LocalTransport(state_home() / "local", num_workers=spec.local_workers, redact=redact)
    from tpuops.transport.ssh import SshTransport

    return SshTransport(
        list(target.workers),
        known_hosts=state_home() / "known_hosts",
        identity=Path(spec.identity).expanduser() if spec.identity else None,
        connect_timeout=spec.connect_timeout,
        redact=redact,
        prepare=target.reach.prepare if target.reach else None,
    )


def connect_all(
    transport: Transport, workers: list[int], parallel: int, *, keep_going: bool
) -> dict[int, TpuopsError]:
    """Open every connection up front, in parallel: a host-key or login problem stops before any step.

    With keep_going, unreachable workers are left out (and reported) and the others go on.
    """
    from concurrent.futures import ThreadPoolExecutor

    errors: dict[int, TpuopsError] = {}

    def one(w: int) -> None:
        try:
            transport.connect(w)
        except TpuopsError as e:
            errors[w] = e

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(workers)))) as pool:
        list(pool.map(one, workers))
    host_key = {w: e for w, e in errors.items() if e.kind == "host_key"}
    if host_key or (errors and not keep_going):
        # A changed or unknown host key is never skipped, even with --keep-going.
        _, first = min((host_key or errors).items())
        if len(errors) > 1 and isinstance(first, ConnectError):
            first.message += f" (and {len(errors) - 1} more worker(s) failed to connect)"
        raise first
    return errors


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
