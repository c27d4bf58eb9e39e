"""Multi-host preflight: worker 0's coordinator port reached from every other worker before a job starts."""

from __future__ import annotations

from tpuops import shell
from tpuops.sop.actions import Action, Command
from tpuops.sop.model import Outcome, PlanContext, markers
from tpuops.transport.base import CmdResult, Worker

WAIT_S = 5  # a port that has not answered a connect in this long is dropped on the way: a firewall


def coordinator_host(workers: list[Worker], worker: int) -> str:
    """Worker 0's address as `worker` reaches it: its internal address (else its host), or the worker's own route
    to it where it has one (an emulated filtered port's)."""
    first = workers[0]
    host = first.internal_host or (first.host if first.host != "localhost" else "127.0.0.1")
    if worker < len(workers) and (route := workers[worker].peer_host):
        return route
    return host


def check(ctx: PlanContext, port: int | str | None) -> list[Action]:
    """From each worker but 0 of a multi-worker VM: one real TCP connect to worker 0's coordinator port.

    Before the job starts nothing listens there, so a refused connection is the answer expected (the port is
    reached); a connect that gets no answer at all within WAIT_S seconds is dropped by a firewall, and
    jax.distributed.initialize would hang on it."""
    if port is None or ctx.num_workers < 2:
        return []
    number = int(ctx.raw(port) if isinstance(port, str) else port)
    # Worker 0 itself: nothing may hold the port yet (jax's coordinator could not bind it).
    host = "127.0.0.1" if ctx.worker == 0 else ctx.coordinator_host
    # bash's /dev/tcp: a connect from the worker itself, with no tool the image may lack.
    script = (
        f"h={shell.quote(host)}; p={number}; "
        f'out=$(timeout {WAIT_S} bash -c \'exec 3<>"/dev/tcp/$0/$1"\' "$h" "$p" 2>&1); rc=$?; '
        "if [ $rc = 0 ]; then r=open; elif [ $rc = 124 ]; then r=filtered; "
        "else case $out in *refused*) r=closed;; *) r=unreachable;; esac; fi; "
        f'echo "tpuops: coordinator=$h:$p reach=$r worker={ctx.worker}"'
    )
    what = (
        f"the coordinator port {number} free on worker 0"
        if ctx.worker == 0
        else f"reach worker 0's coordinator port {ctx.coordinator_host}:{number} from this worker"
    )
    return [Command(script, timeout=WAIT_S + 25, what=what)]


def verdict(results: list[CmdResult]) -> Outcome:
    """Reached (answered, open or refused): ok. Dropped or unroutable: failed, a connection failure (exit 3)."""
    r = results[-1] if results else None
    found = markers(r.stdout) if r is not None else []
    if r is None or not found:
        why = (r.stderr.strip() or r.error or f"exit {r.exit_code}") if r is not None else "no result"
        return Outcome("failed", f"the coordinator port check did not run: {why[:200]}")
    m = found[-1]
    where, reach = m.get("coordinator", "?"), m.get("reach", "?")
    if m.get("worker") == "0":  # worker 0 asked itself: is the port still free for jax's coordinator?
        if reach == "open":
            port = where.rsplit(":", 1)[-1]
            detail = (
                f"the coordinator port {port} is already taken on worker 0 (another process listens there): "
                "stop it, or pass --set coordinator_port=A_FREE_PORT"
            )
            return Outcome("failed", detail, {"port": int(port) if port.isdigit() else port})
        return Outcome("ok", f"coordinator port {where.rsplit(':', 1)[-1]} free")
    if reach in ("open", "closed"):
        return Outcome("ok", f"coordinator {where} reached ({reach})")
    port = where.rsplit(":", 1)[-1]
    how = f"no answer within {WAIT_S}s" if reach == "filtered" else "no route"
    detail = (
        f"worker 0's coordinator port {port} ({where}) cannot be reached from this worker ({how}): "
        f"jax.distributed would hang there; allow TCP {port} between the VM's workers (a firewall rule: "
        f"gcloud compute firewall-rules create allow-jax-coordinator --network=NETWORK --allow=tcp:{port} "
        "--source-ranges=THE_WORKERS_SUBNET), or pass --set coordinator_port=AN_OPEN_PORT"
    )
    return Outcome("failed", detail, {"error_kind": "connect", "port": int(port) if port.isdigit() else port})
