"""One run per VM: the per-worker run lock (taken atomically before anything changes), and the shell pieces
that start, stop and end a detached job with its pid, exit code and lock in order.

The lock is a directory, `~/.tpuops-run.lock`, made with `mkdir` (atomic on every POSIX filesystem). It holds
the run id (`run`), the run directory (`rd`) and the pid of its holder (`pid`): while the SOP prepares the
workers a stand-in `sleep` process started by the claim, once the job runs the job itself (its process group
leader). A lock whose holder is no longer running is stale and taken over; the job's own shell removes it when
the job ends, `tpuops stop` when it stops the run, the executor when the SOP ends without starting a job.
Pid and exit files are written at a fixed width into space reserved before the job starts, so a disk that
fills up can neither leave a job without a pid file nor a finished job without its exit code.
"""

from __future__ import annotations

from dataclasses import replace

from tpuops import shell
from tpuops.logs.events import STOPPED
from tpuops.sop.actions import Action, Command
from tpuops.sop.steps import BUSY_EXIT

LOCK = "$HOME/.tpuops-run.lock"  # in the home of the worker's login: per VM for the user who runs its jobs
CLAIM_TTL_S = 7200  # a claim whose client died holds the lock this long at most (git, venv: well below)
WIDTH = 20  # pid and exit files: one line of this width, overwritten in place (no new disk block needed)

# `pid_of FILE`: the digits of a pid file (empty when there is none). `reserve FILE`: the file's bytes
# written now (a full disk fails here, with "No space left on device" from tr). `put FILE TEXT`: TEXT written
# over those reserved bytes without truncating them. `put_exit RD K TEXT`: the exit file, atomically (tmp+mv).
# `stop_group PID`: SIGTERM to the job's process group, up to 10 s, then SIGKILL, then wait until it is gone.
# `held`: the lock's holder still runs: the same boot (`boot`), the same process (`pid`, and its start time
# `start`: a pid the kernel gave to another process since is not the holder). `stop_step`: the step of the run
# that is running now (its process group in `step`, checked by its leader's start time in `step-start`; its
# name in `step-what`, read before it is stopped: the run's own clean-up may give the lock back meanwhile) stopped.
HELPERS = (
    shell.RUNNING
    + f"""
pid_of() {{ head -c 64 "$1" 2>/dev/null | tr -dc 0-9; }}
reserve() {{ head -c {WIDTH + 1} /dev/zero | tr '\\0' ' ' > "$1"; }}
put() {{ printf '%-{WIDTH}s\\n' "$2" 1<> "$1"; }}
put_exit() {{ if [ -f "$1/worker-$2.exit.tmp" ]; then put "$1/worker-$2.exit.tmp" "$3"
  else printf '%s\\n' "$3" > "$1/worker-$2.exit.tmp"; fi && mv -f "$1/worker-$2.exit.tmp" "$1/worker-$2.exit"; }}
stop_group() {{ kill -TERM "-$1" 2>/dev/null || kill -TERM "$1" 2>/dev/null || true
  i=0; while running "$1" && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  if running "$1"; then kill -KILL "-$1" 2>/dev/null || kill -KILL "$1" 2>/dev/null || true; fi
  while running "$1"; do sleep 0.05; done; }}
stime() {{ sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }}
boot_id() {{ cat /proc/sys/kernel/random/boot_id 2>/dev/null; }}
lock="{LOCK}"
held() {{ p=$(pid_of "$lock/pid"); [ -n "$p" ] || return 1
  b=$(cat "$lock/boot" 2>/dev/null); [ -z "$b" ] || [ "$b" = "$(boot_id)" ] || return 1
  s=$(pid_of "$lock/start"); [ -z "$s" ] || [ "$s" = "$(stime "$p")" ] || return 1
  running "$p"; }}
stop_step() {{ s=$(pid_of "$lock/step"); if [ -n "$s" ] && [ "$s" != "$(sed 's/.*) //' /proc/$$/stat | cut -d' ' -f3)" ] &&
  [ "$(stime "$s")" = "$(pid_of "$lock/step-start")" ] && running "$s"; then
  what=$(cat "$lock/step-what" 2>/dev/null); stop_group "$s"; echo "tpuops: stopped ${{what:-step}}"; fi; }}
"""
)


def claim_script(run_id: str, rd: str, runs: str, worker: int, *, force: bool) -> str:
    """Take the lock on one worker, or say who holds it (exit BUSY_EXIT). Under the lock, runs started
    without one (older tpuops) are looked for in `runs`. `--force` stops a live holder first. Nothing else on
    the worker changes: a refused claim leaves it as it was."""
    f = "1" if force else "0"
    return f"""{HELPERS}
rid={shell.quote(run_id)}; rd={rd}; k={worker}; force={f}
busy() {{ echo "tpuops: active run=$1 pid=$2"; echo "run $1 (pid $2) is active" >&2; }}
n=0; ending=0
while ! err=$(mkdir "$lock" 2>&1); do
  if [ ! -d "$lock" ]; then  # given back meanwhile (retry), or mkdir itself failed (its error says why)
    n=$((n+1)); [ $n -lt 5 ] && continue; echo "$err" >&2; exit 1; fi
  other=$(cat "$lock/run" 2>/dev/null); pid=$(pid_of "$lock/pid")
  if [ "$other" = "$rid" ]; then echo "tpuops: claimed again"; exit 0; fi
  if [ -z "$pid" ] && [ $(( $(date +%s) - $(stat -c %Y "$lock") )) -lt 30 ]; then
    busy "${{other:-?}}" starting; exit {BUSY_EXIT}; fi  # being claimed this very moment
  if held; then
    ord=$(cat "$lock/rd" 2>/dev/null)
    if [ -n "$ord" ] && [ -e "$ord/worker-$k.exit" ] && [ $ending -lt 400 ]; then
      ending=$((ending+1)); sleep 0.05; continue; fi  # its job has ended: it gives the lock back in a moment
    if [ $force != 1 ]; then busy "$other" "$pid"; exit {BUSY_EXIT}; fi
    stop_step; stop_group "$pid"
    if [ -n "$ord" ] && [ -f "$ord/worker-$k.pid" ] && [ ! -e "$ord/worker-$k.exit" ]; then
      put_exit "$ord" $k "143 {STOPPED}"; fi
    echo "tpuops: stopped run=$other pid=$pid"
  else  # from before a reboot, or its pid now another process's: stale; a step it left running is stopped
    why=gone; [ -n "$pid" ] && alive "$pid" && why=reused
    b=$(cat "$lock/boot" 2>/dev/null); [ -n "$b" ] && [ "$b" != "$(boot_id)" ] && why=reboot
    [ "$why" = reboot ] || stop_step
    echo "tpuops: stale run=${{other:-?}} pid=${{pid:-none}} why=$why"; fi
  # Its holder is gone: take it over, one taker at a time (a second lock keeps two takers apart).
  if mkdir "$lock.takeover" 2>/dev/null; then
    [ "$(pid_of "$lock/pid")" = "$pid" ] && rm -rf "$lock"
    rmdir "$lock.takeover"
  elif [ $(( $(date +%s) - $(stat -c %Y "$lock.takeover" 2>/dev/null || date +%s) )) -gt 60 ]; then
    rmdir "$lock.takeover" 2>/dev/null || true; fi
  n=$((n+1)); if [ $n -ge 5 ]; then busy "$other" "$pid"; exit {BUSY_EXIT}; fi
done
release() {{ rm -rf "$lock"; }}
# A stand-in holder until the job runs: the lock is stale as soon as nothing of this run holds it.
setsid nohup sleep {CLAIM_TTL_S} > /dev/null 2>&1 < /dev/null &
h=$!
if ! err=$( {{ printf '%s\\n' "$rid" > "$lock/run" && printf '%s\\n' "$rd" > "$lock/rd" &&
    boot_id > "$lock/boot" && reserve "$lock/start" && put "$lock/start" "$(stime $h)" &&
    reserve "$lock/step" && reserve "$lock/pid.tmp" && put "$lock/pid.tmp" $h && mv "$lock/pid.tmp" "$lock/pid"; }} 2>&1 ); then
  kill $h 2>/dev/null; release; echo "$err" >&2; exit 1; fi
# Runs started without the lock (an older tpuops) are still seen: a live one refuses the claim too.
for f in {runs}/*/worker-*.pid; do
  [ -e "$f" ] || continue; other=$(basename "$(dirname "$f")"); [ "$other" = "$rid" ] && continue
  [ -e "${{f%.pid}}.exit" ] && continue
  pid=$(pid_of "$f"); [ -n "$pid" ] && running "$pid" || continue
  if [ $force != 1 ]; then kill $h 2>/dev/null; release; busy "$other" "$pid"; exit {BUSY_EXIT}; fi
  stop_group "$pid"; put_exit "$(dirname "$f")" "$(basename "$f" .pid | sed 's/worker-//')" "143 {STOPPED}"
  echo "tpuops: stopped run=$other pid=$pid"
done
echo "tpuops: claimed pid=$h"
"""


def release_script(run_id: str, worker: int) -> str:
    """Give the lock back at the end of a SOP that holds no job here: the run's job is stopped all the same
    when one is found in the run directory the lock names (a start whose reply was lost may have started it;
    never another run's: only a lock that is still this run's names it), the stand-in ends, the lock goes."""
    return _give_back("give the run lock back", run_id, None, worker)


def stop_started_script(run_id: str, rd: str, worker: int) -> str:
    """Stop a job this run started on a worker, or may have started there (all or none: its start failed
    somewhere), write its exit file, and give the lock back."""
    return _give_back("stop what this run started here", run_id, rd, worker)


def _give_back(why: str, run_id: str, rd: str | None, worker: int) -> str:
    """The job found by the worker's pid file in `rd` (None: the run directory the lock names, when the lock is
    still this run's) stopped (SIGTERM to its process group, SIGKILL after 10 s) and its exit file written
    ("143 stopped"); the lock, when it is still this run's, given back: its holder, when that is the claim's
    stand-in and not the job, ends first."""
    mine = '[ "$(cat "$lock/run" 2>/dev/null)" = "$rid" ]'
    where = f"rd={rd}" if rd is not None else f'rd=""; {mine} && rd=$(cat "$lock/rd" 2>/dev/null)'
    return f"""# tpuops: {why}
{HELPERS}
rid={shell.quote(run_id)}; k={worker}
{where}
pid=""; [ -n "$rd" ] && pid=$(pid_of "$rd/worker-$k.pid")
if {mine}; then stop_step; fi
if [ -n "$pid" ] && running "$pid"; then stop_group "$pid"; echo "tpuops: stopped pid=$pid"; fi
if [ -n "$rd" ] && [ -f "$rd/worker-$k.pid" ] && [ ! -e "$rd/worker-$k.exit" ]; then
  put_exit "$rd" $k "143 {STOPPED}"; fi
if {mine}; then
  h=$(pid_of "$lock/pid"); if [ -n "$h" ] && [ "$h" != "$pid" ] && held; then kill "$h" 2>/dev/null; fi
  rm -rf "$lock"; echo "tpuops: released"
else echo "tpuops: nothing to release"; fi
exit 0
"""


LOST_EXIT = 77  # a step of a run that no longer holds the worker's run lock: it ran nothing
LOST = "lock-lost"


def guarded(run_id: str, what: str, script: str) -> str:
    """A step's script that runs only while this run holds the worker's run lock, its process group and name
    written into the lock first (`step`, `step-what`): `tpuops stop`, the clean-up after Ctrl-C and a later
    run's takeover end it there, and after a stop nothing of the run starts."""
    return f"""lock="{LOCK}"
if [ "$(cat "$lock/run" 2>/dev/null)" != {shell.quote(run_id)} ] || [ -e "$lock/stopping" ]; then
  echo "tpuops: {LOST}"
  echo "this run no longer holds the worker's run lock (tpuops stop, or --force of another run)" >&2
  exit {LOST_EXIT}; fi
g=$(sed 's/.*) //' /proc/$$/stat | cut -d' ' -f3)
printf '%-{WIDTH}s\\n' "$g" 1<> "$lock/step" 2>/dev/null &&
  sed 's/.*) //' "/proc/$g/stat" | cut -d' ' -f20 > "$lock/step-start" 2>/dev/null
printf '%s\\n' {shell.quote(what)} > "$lock/step-what" 2>/dev/null || true
{shell.STEP_BEGINS}
{script}"""


def guard(action: Action, run_id: str, what: str) -> Action:
    """A step's command, guarded (see `guarded`); other actions (uploads, follows) as they are."""
    if isinstance(action, Command):
        return replace(action, script=guarded(run_id, what, action.script))
    return action


def lost_script(run_id: str) -> str:
    """Whether this run lost the worker's lock (`tpuops stop` marks it `stopping` before it ends anything): a
    step that failed because the stop ended it is the stop's doing, not the step's."""
    return (
        f'lock="{LOCK}"; if [ "$(cat "$lock/run" 2>/dev/null)" != {shell.quote(run_id)} ] || '
        f'[ -e "$lock/stopping" ]; then echo "tpuops: {LOST}"; fi'
    )
