"""Each repository's home on a worker (`~/tpuops/<name>-<hash>/`: its checkout and its venv, run/tree.repo_home):
listed with its size, its last use and what keeps it (`tpuops doctor`), and removed (`tpuops vm clean`).

A home is never removed while a run uses it: while a live run holds the worker's run lock (sop/claim.py) every
home there stays; with the lock free, `clean` takes it for itself (so no run starts while homes go), and a home
that one of the login's processes works in (its cwd: a job started outside tpuops) stays too."""

from __future__ import annotations

from dataclasses import dataclass

from tpuops.errors import TpuopsError
from tpuops.sop.claim import HELPERS
from tpuops.transport.base import Transport

BASE = "tpuops"  # the folder in the worker's home that holds the homes
# Only folders named as run/tree.repo_home names them: a repository's name and 8 hex digits of its URL's hash.
NAME = r"^[A-Za-z0-9._-]+-[0-9a-f]{8}$"
MARK = "tpuops: home "


@dataclass(frozen=True)
class Home:
    """One home on one worker: `state` is `listed` (a look), or what `clean` did: `removed`, `kept: in use`,
    `kept: recent`; `why` what uses it (a run holding the run lock, a process working in it), else empty."""

    worker: int
    name: str
    kb: int  # its size on disk (du -sk)
    used: (
        int  # its last use, epoch seconds: the checkout's last fetch (every sync fetches), else the folder's
    )
    state: str
    why: str = ""

    @property
    def path(self) -> str:
        return f"~/{BASE}/{self.name}"


def script(*, remove: bool, older_than_s: int | None) -> str:
    """One worker's homes listed, or removed (those not in use and, with `older_than_s`, unused that long),
    each as `tpuops: home name=N kb=K used=T state=S why=TEXT`."""
    older = -1 if older_than_s is None else int(older_than_s)
    return f"""{HELPERS}
base="$HOME/{BASE}"; remove={int(remove)}; older={older}; now=$(date +%s); busy=""
if [ $remove = 1 ] && mkdir "$lock" 2>/dev/null; then  # this clean holds the run lock: no run starts meanwhile
  trap 'rm -rf "$lock"' EXIT; trap 'exit 143' INT TERM HUP
  printf '%s\\n' vm-clean > "$lock/run"; printf '%s\\n' $$ > "$lock/pid.tmp" && mv "$lock/pid.tmp" "$lock/pid"
elif [ -d "$lock" ]; then
  if held; then busy="run $(head -c 120 "$lock/run" 2>/dev/null | tr -dc 'A-Za-z0-9._-') holds the run lock"
  elif [ -z "$(pid_of "$lock/pid")" ] && [ $(( now - $(stat -c %Y "$lock" 2>/dev/null || echo 0) )) -lt 30 ]; then
    busy="a run is taking the run lock"; fi  # else a lock left behind: the next run takes it over
fi
cd "$base" 2>/dev/null || exit 0
for h in */; do n=${{h%/}}
  printf '%s' "$n" | grep -Eq '{NAME}' || continue
  [ -e "$n/checkout" ] || [ -e "$n/venv" ] || continue
  used=$(stat -c %Y "$n/checkout/.git/FETCH_HEAD" 2>/dev/null || stat -c %Y "$n")
  kb=$(du -sk "$n" 2>/dev/null | cut -f1)
  why=$busy
  if [ -z "$why" ]; then for p in /proc/[0-9]*; do
    [ -O "$p" ] || continue
    c=$(readlink "$p/cwd" 2>/dev/null) || continue
    case "$c/" in "$base/$n/"*) why="process ${{p#/proc/}} works in it"; break;; esac
  done; fi
  state=listed
  if [ $remove = 1 ]; then
    if [ -n "$why" ]; then state="kept:_in_use"
    elif [ $older -ge 0 ] && [ $(( now - used )) -lt $older ]; then state="kept:_recent"
    elif rm -rf "$n" 2>/dev/null || {{ chmod -R u+w "$n" 2>/dev/null; rm -rf "$n"; }}; then state=removed
    else state="kept:_not_removable"; fi
  fi
  echo "{MARK}name=$n kb=${{kb:-0}} used=$used state=$state why=$why"
done
"""


def parse(worker: int, stdout: str) -> list[Home]:
    """The homes a `script` printed (its `why` is the rest of the line: words with spaces)."""
    found = []
    for line in stdout.splitlines():
        if not line.startswith(MARK):
            continue
        head, _, why = line[len(MARK) :].partition(" why=")
        fields = dict(part.split("=", 1) for part in head.split() if "=" in part)
        found.append(
            Home(
                worker,
                fields["name"],
                int(fields.get("kb") or 0),
                int(fields.get("used") or 0),
                fields["state"].replace("_", " "),
                why.strip(),
            )
        )
    return found


def homes(
    transport: Transport, worker: int, *, remove: bool = False, older_than_s: int | None = None
) -> list[Home]:
    """One worker's homes (connected already): listed, or cleaned. A script that fails is a TpuopsError naming
    the worker."""
    r = transport.run(worker, script(remove=remove, older_than_s=older_than_s), timeout=1800)
    if not r.ok:
        said = (r.stderr or r.error or f"exit {r.exit_code}").strip().splitlines()
        raise TpuopsError(f"homes on {transport.workers[worker].label}: {said[-1] if said else r.kind}")
    return parse(worker, r.stdout)
