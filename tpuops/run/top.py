"""`tpuops top RUN_ID`: each worker's chips at its latest step line (HBM in use per chip, duty cycle), asked of
every worker of the run at once, and whether its job still runs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from tpuops import shell
from tpuops.errors import TpuopsError
from tpuops.logs.events import Chips, chip_fields
from tpuops.logs.scanner import LogScanner
from tpuops.run.store import RunRecord, load
from tpuops.run.target import open_transport, resolve

if TYPE_CHECKING:
    from tpuops.transport.base import Transport

TAIL_BYTES = 1 << 20  # the end of each log that is read for its latest step or chips line
NO_CHIPS = (
    "memory fields absent: the workers' backend exposes no HBM or duty cycle (a CPU backend has none; TPU and GPU "
    "step lines carry hbm_gb_* and duty_pct_*)"
)


@dataclass(frozen=True)
class WorkerTop:
    """One worker now: its job's state, the step of its latest step or chips line, its chips then (None: none)."""

    worker: int
    state: str  # running, exited N, lost, unreachable
    step: int | None
    chips: Chips | None  # the latest chip sample's fields but its step
    detail: str = ""


@dataclass(frozen=True)
class Top:
    run_id: str
    workers: tuple[WorkerTop, ...]

    @property
    def memory_fields(self) -> bool:
        return any(w.chips for w in self.workers)

    @property
    def running(self) -> bool:
        return any(w.state in ("running", "starting") for w in self.workers)

    def to_dict(self) -> dict[str, object]:
        return {
            "run_id": self.run_id, "workers": [asdict(w) for w in self.workers],
            "memory_fields": self.memory_fields, "note": None if self.memory_fields else NO_CHIPS,
        }  # fmt: skip


def _script(rec: RunRecord, w: int) -> str:
    from tpuops.sop.claim import HELPERS

    rd = shell.path(rec.remote_dir)
    return f"""{HELPERS}
rd={rd}; k={w}; pid=$(pid_of "$rd/worker-$k.pid")
if [ -f "$rd/worker-$k.exit" ]; then set -- $(cat "$rd/worker-$k.exit"); echo "tpuops: state=exited code=$1"
elif [ -n "$pid" ] && running "$pid"; then echo "tpuops: state=running"
else echo "tpuops: state=lost"; fi
tail -c {TAIL_BYTES} "$rd/worker-$k.log" 2>/dev/null | grep -E '^(step=|chips: )' | tail -n 1
"""


def _one(rec: RunRecord, transport: Transport, w: int) -> WorkerTop:
    from tpuops.sop.model import markers

    try:
        r = transport.run(w, _script(rec, w), timeout=20)
    except TpuopsError as e:
        return WorkerTop(w, "unreachable", None, None, e.line())
    m = next((m for m in markers(r.stdout) if "state" in m), None)
    if not r.ok or m is None:
        return WorkerTop(w, "unreachable", None, None, (r.error or r.stderr.strip())[:200])
    state = f"exited {m['code']}" if m["state"] == "exited" else m["state"]
    scanner = LogScanner(worker=w)
    for line in r.stdout.splitlines():
        if not line.startswith("tpuops: "):
            scanner.feed(line)
    report = scanner.close()
    sample = report.chips.get(w) or next(iter(report.chips.values()), None)
    latest = sample[-1] if sample else None
    step = latest["step"] if latest else report.last_step
    chips = chip_fields(latest) if latest else None
    return WorkerTop(w, state, step, chips)


def snapshot(run_id: str) -> Top:
    """Every worker of the run asked at once (one SSH command each)."""
    rec = load(run_id)
    transport = open_transport(resolve(rec.spec()), rec.redactor())
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(len(rec.workers), 32))) as pool:
            found = list(pool.map(lambda w: _one(rec, transport, w), rec.workers))
    finally:
        transport.close()
    return Top(run_id, tuple(found))


def quit_pressed(seconds: float, fd: int | None = None) -> bool:
    """Wait up to `seconds` for the next snapshot; True as soon as `q` is typed (stdin a terminal: read key by
    key, the terminal's mode restored after). Without a terminal it only waits (Ctrl-C still ends `top`)."""
    import os
    import select
    import sys
    import time

    fd = sys.stdin.fileno() if fd is None else fd
    if not os.isatty(fd):
        time.sleep(seconds)
        return False
    import termios
    import tty

    before = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)  # keys arrive one by one, unechoed; Ctrl-C still interrupts
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], left)
            if ready and os.read(fd, 1) in (b"q", b"Q"):
                return True
        return False
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, before)
