"""The preemption-notice watcher that runs beside a job on a worker (standard library only: it is sent as a file).

    python3 notice_watch.py MODE NOTICE_FILE       (MODE: signal or file)

Started by the job's own shell in the job's process group (sop/notice.py). It watches the worker's metadata server
(`GCE_METADATA_HOST`, default metadata.google.internal) for `instance/preempted` = TRUE and
`instance/maintenance-event` = TERMINATE_ON_HOST_MAINTENANCE, reading each value once, then waiting for its change
(`?wait_for_change=true&last_etag=...`). On a notice it writes NOTICE_FILE (`instance/preempted=TRUE`), then with
MODE signal sends SIGTERM to every process of the job's group but the group's leader (the shell that writes the
job's exit code afterwards) and itself, and ends. It ends too when the job's shell is gone. A metadata server that
cannot be reached or answers nonsense is retried with backoff and never disturbs the job.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

KEYS = ("preempted", "maintenance-event")
WAIT_S = 60  # one wait_for_change at most; then asked again
TRIES_QUIET = 3  # failures said once each kind, then quietly retried


def noticed(key: str, value: str) -> bool:
    """Whether this value of this key says the VM is about to go (a live migration is no notice)."""
    v = value.strip().upper()
    return v == "TRUE" if key == "preempted" else v.startswith("TERMINATE")


def base_url() -> str:
    host = os.environ.get("GCE_METADATA_HOST", "").strip() or "metadata.google.internal"
    return f"http://{host}/computeMetadata/v1/instance/"


def say(text: str) -> None:
    sys.stdout.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} notice-watch: {text}\n")
    sys.stdout.flush()


def read(key: str, etag: str | None) -> tuple[str, str | None]:
    """(value, ETag); with an ETag, once the value differs from it (or the wait ended)."""
    url = base_url() + key
    if etag is not None:
        url += f"?wait_for_change=true&timeout_sec={WAIT_S}&last_etag={etag}"
    req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=WAIT_S + 15) as r:
        if r.headers.get("Metadata-Flavor") != "Google":
            raise ValueError("the answer is not from a metadata server (no Metadata-Flavor: Google)")
        return r.read(4096).decode(errors="replace"), r.headers.get("ETag")


def watch(key: str, found: list[str], done: threading.Event) -> None:
    """Follow one key until it says the VM goes (then `found` gets `key=value` and `done` is set)."""
    etag: str | None = None
    fails = 0
    while not done.is_set():
        try:
            value, etag = read(key, etag)
        except (OSError, ValueError, urllib.error.HTTPError) as e:  # URLError and timeouts are OSErrors
            fails += 1
            if fails <= TRIES_QUIET:
                say(f"instance/{key}: {getattr(e, 'reason', None) or e} (retrying; the job goes on)")
            etag = None
            done.wait(min(60.0, 2.0**fails))
            continue
        fails = 0
        if noticed(key, value):
            found.append(f"instance/{key}={value.strip()}")
            done.set()
            return


def job_processes() -> list[int]:
    """The job's processes: this process group's, but its leader (the job's shell) and this watcher."""
    group, me, out = os.getpgrp(), os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (group, me):
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("signal", "file"):
        sys.stderr.write("usage: notice_watch.py signal|file NOTICE_FILE\n")
        return 2
    mode, path = argv
    parent = os.getppid()
    found: list[str] = []
    done = threading.Event()
    for key in KEYS:
        threading.Thread(target=watch, args=(key, found, done), daemon=True).start()
    say(f"watching {base_url()}{{{','.join(KEYS)}}}")
    while not done.wait(1.0):
        if os.getppid() != parent:  # the job's shell is gone: nothing left to tell
            return 0
    notice = found[0]
    tmp = Path(f"{path}.tmp")
    tmp.write_text(notice + "\n")
    tmp.replace(path)
    if mode == "signal":
        pids = job_processes()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        say(f"{notice}: wrote {path}, sent SIGTERM to {' '.join(map(str, pids)) or 'no process'}")
    else:
        say(f"{notice}: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
