"""The coordinator port check's script, run by a real bash against real loopback sockets, and its verdict."""

from __future__ import annotations

import socket
import subprocess

from tpuops.cloud.emulator import ports
from tpuops.cloud.emulator.sshd import free_port
from tpuops.sop.actions import Command
from tpuops.sop.model import PlanContext
from tpuops.sop.ports import check, verdict
from tpuops.transport.base import CmdResult


def _run(host: str, port: int, worker: int = 1) -> CmdResult:
    ctx = PlanContext(worker, 2, "r1", {}, coordinator_host=host)
    (cmd,) = check(ctx, str(port))
    assert isinstance(cmd, Command)
    out = subprocess.run(["sh", "-c", cmd.script], capture_output=True, text=True, check=False, timeout=30)
    return CmdResult(worker, "check", out.returncode, out.stdout, out.stderr)


def test_a_port_that_answers_passes_and_one_that_drops_refuses_naming_port_and_rule() -> None:
    port = free_port()
    assert verdict([_run("127.0.0.1", port)]).status == "ok"  # refused: reached, nothing listens yet
    address = ports.filter_port("node-x", 1, port)
    try:
        got = verdict([_run(address, port)])
    finally:
        ports.clear("node-x")
    assert got.status == "failed" and got.data == {"error_kind": "connect", "port": port}
    assert f"coordinator port {port} ({address}:{port})" in got.detail and "no answer within 5s" in got.detail
    assert f"--allow=tcp:{port}" in got.detail


def test_worker_0_refuses_a_port_another_process_holds_and_one_worker_is_not_checked() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        got = verdict([_run("10.0.0.2", port, worker=0)])
    assert got.status == "failed" and "already taken on worker 0" in got.detail
    assert verdict([_run("10.0.0.2", port, worker=0)]).status == "ok"  # released
    assert check(PlanContext(0, 1, "r1", {}), "8476") == [] and check(PlanContext(1, 2, "r1", {}), None) == []
