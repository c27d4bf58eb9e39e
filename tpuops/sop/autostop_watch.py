"""The autostop watcher on a VM's worker 0 (standard library only: it is sent as a file).

    python3 autostop_watch.py DIR        (DIR: ~/.tpuops-autostop, holding config.json)

Started detached by `tpuops vm create --autostop`, `tpuops vm autostop` and each run's start (sop/autostop.py); a
second start while one watches ends at once (the one holds DIR/lock). Every `poll_s` it reads DIR/config.json
(gone: autostop was turned off, it ends) and asks whether the worker is busy: a run lock (`~/.tpuops-run.lock`,
sop/claim.py) whose holder runs (same boot, same pid and start time), or a job whose pid file in a runs folder has no
exit file beside it and whose process group still runs. Idle for `idle_s` on end: it takes the run lock itself (a run
starting meanwhile is refused as busy, not cut off), asks the metadata server for the VM's service-account token and
makes the config's REST calls (stop or delete this VM), then ends. It publishes what it sees as the guest attribute
`tpuops/autostop` ("idle SINCE ACTS_AT", "busy WHY", "acting ACTION"), which `tpuops vm describe` shows.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

LOCK_NAME = ".tpuops-run.lock"
CLAIMING_S = 30  # a lock without a pid this young is being claimed right now (sop/claim.py's rule)


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first); None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def running(pid: int) -> bool:
    """The process, or another of the process group it leads, runs (zombies aside), as claim.py's `running`."""
    own = _stat(pid)
    if own is not None and own[0] != "Z":
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(int(stat.parent.name))
        if fields is not None and fields[0] != "Z" and fields[2] == str(pid):
            return True
    return False


def _digits(path: Path) -> int | None:
    try:
        text = "".join(c for c in path.read_text()[:64] if c.isdigit())
    except OSError:
        return None
    return int(text) if text else None


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def lock_holder(lock: Path, now: float) -> str | None:
    """Why the run lock counts as held ("run RUN pid PID"), None when it is free or stale."""
    if not lock.is_dir():
        return None
    pid = _digits(lock / "pid")
    run = (lock / "run").read_text().strip() if (lock / "run").is_file() else "?"
    if pid is None:
        try:
            young = now - lock.stat().st_mtime < CLAIMING_S
        except OSError:
            return None
        return f"run {run} claiming" if young else None
    boot = (lock / "boot").read_text().strip() if (lock / "boot").is_file() else ""
    if boot and boot != boot_id():
        return None  # from before a reboot
    start = _digits(lock / "start")
    fields = _stat(pid)
    if start is not None and (fields is None or fields[19] != str(start)):
        return None  # its pid is another process's now
    return f"run {run} pid {pid}" if running(pid) else None


def live_job(runs: Path) -> str | None:
    """A job started under `runs` that has no exit file and still runs ("job RUN pid PID"), else None."""
    for pid_file in sorted(runs.glob("*/worker-*.pid")):
        if pid_file.with_suffix(".exit").exists():
            continue
        pid = _digits(pid_file)
        if pid is not None and running(pid):
            return f"job {pid_file.parent.name} pid {pid}"
    return None


def busy(home: Path, runs: list[str], now: float) -> str | None:
    """The idle rule: why the worker is busy, None when it is idle."""
    reason = lock_holder(home / LOCK_NAME, now)
    for r in runs:
        if reason:
            break
        folder = Path(r.replace("~", str(home), 1) if r.startswith("~") else r)
        reason = live_job(folder)
    return reason


class Idle:
    """How long the worker has been idle: `see` each poll's reason; `acts_at` once idle, None while busy."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.since: float | None = None

    def see(self, reason: str | None, now: float) -> float | None:
        if reason is not None:
            self.since = None
            return None
        if self.since is None:
            self.since = now
        return self.since + self.idle_s


def _metadata(path: str, method: str = "GET", data: bytes | None = None) -> bytes:
    host = os.environ.get("GCE_METADATA_HOST", "").strip() or "metadata.google.internal"
    req = urllib.request.Request(
        f"http://{host}/computeMetadata/v1/instance/{path}", data=data, method=method
    )
    req.add_header("Metadata-Flavor", "Google")
    with urllib.request.urlopen(req, timeout=10) as resp:
        body: bytes = resp.read()
        return body


def publish(text: str) -> None:
    """The guest attribute `tpuops/autostop` (what `vm describe` reads); a failure is only logged."""
    try:
        _metadata("guest-attributes/tpuops/autostop", "PUT", text.encode())
    except (OSError, ValueError) as e:
        print(f"autostop: could not publish {text!r}: {e}", flush=True)


def take_lock(home: Path, now: float) -> bool:
    """The run lock, held by this watcher while it acts (a run starting now is refused as busy); a stale one is
    taken over (moved aside first: a run that claims it meanwhile wins, and the watcher does not act)."""
    lock = home / LOCK_NAME
    if lock.is_dir() and lock_holder(lock, now) is None:
        aside = lock.with_name(f"{LOCK_NAME}.stale-{os.getpid()}")
        try:
            lock.rename(aside)
            shutil.rmtree(aside, ignore_errors=True)
        except OSError:
            return False
    try:
        lock.mkdir()
    except OSError:
        return False
    me = _stat(os.getpid())
    (lock / "run").write_text("autostop\n")
    (lock / "boot").write_text(boot_id() + "\n")
    (lock / "start").write_text(f"{me[19] if me else ''}\n")
    (lock / "pid").write_text(f"{os.getpid()}\n")
    return True


def give_lock_back(home: Path) -> None:
    lock = home / LOCK_NAME
    if _digits(lock / "pid") == os.getpid():
        for f in lock.iterdir():
            f.unlink()
        lock.rmdir()


def act(calls: list[list[str]]) -> None:
    """The config's REST calls, in order, with the VM's service-account token (raises on a failure)."""
    token = json.loads(_metadata("service-accounts/default/token"))["access_token"]
    for method, url in calls:
        req = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
        req.add_header("Authorization", f"Bearer {token}")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=60) as resp:
            print(f"autostop: {method} {url}: {resp.status}", flush=True)


def main(directory: Path) -> int:
    holder = (directory / "lock").open("a")
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another watcher watches: it reads the new config at its next poll
    (directory / "pid").write_text(f"{os.getpid()}\n")
    home = Path.home()
    idle: Idle | None = None
    shown = ""
    while True:
        try:
            cfg = json.loads((directory / "config.json").read_text())
        except (OSError, ValueError):
            print("autostop: turned off", flush=True)
            publish("off")
            return 0
        if idle is None or idle.idle_s != float(cfg["idle_s"]):
            idle = Idle(float(cfg["idle_s"]))
        now = time.time()
        reason = busy(home, list(cfg.get("runs", ["~/tpuops/runs"])), now)
        acts_at = idle.see(reason, now)
        state = f"busy {reason}" if acts_at is None else f"idle {idle.since:.0f} {acts_at:.0f}"
        if state != shown:
            print(f"autostop: {state}", flush=True)
            publish(state)
            shown = state
        if acts_at is not None and now >= acts_at and take_lock(home, now):
            publish(f"acting {cfg['action']}")
            try:
                act(cfg["calls"])
                return 0
            except (OSError, ValueError, KeyError) as e:
                print(f"autostop: {cfg['action']} failed, tried again next poll: {e}", flush=True)
                give_lock_back(home)
                shown = ""
        time.sleep(float(os.environ.get("TPUOPS_AUTOSTOP_POLL_S") or cfg.get("poll_s", 30)))


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
