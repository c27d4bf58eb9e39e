"""What a follow asks a worker beside its log: whether the job is still alive, and its Python stacks (py-spy)."""

from __future__ import annotations

import time

from tpuops import shell
from tpuops.logs.actions import Follow
from tpuops.transport.base import Transport


def job_died(transport: Transport, w: int, action: Follow) -> bool:
    """The pid file's process is gone and still no exit file (it is written just before the process ends)."""
    rd = shell.path(action.run_dir)
    r = transport.run(
        w,
        f"{shell.ALIVE}; [ -e {rd}/worker-{w}.exit ] || "
        f'alive "$(head -c 64 {rd}/worker-{w}.pid 2>/dev/null | tr -dc 0-9)" || echo dead',
        timeout=30,
    )
    if r.ok and r.stdout.strip() == "dead":
        time.sleep(0.5)  # the exit file may land right after the process ends
        return transport.read_from(w, f"{action.run_dir}/worker-{w}.exit", 0) is None
    return False


def py_spy(transport: Transport, w: int, action: Follow) -> str:
    """Python stacks of the job's processes (its session: the job leads one) with `py-spy dump`.

    py-spy is looked for beside each process's own interpreter (a venv's bin/) before PATH.
    """
    pid = f"$(head -c 64 {shell.path(action.run_dir)}/worker-{w}.pid | tr -dc 0-9)"
    script = f"""found=0
for p in $(pgrep -s {pid}); do
  exe=$(tr '\\0' '\\n' < /proc/$p/cmdline 2>/dev/null | head -n 1)
  case "$(basename "$exe")" in python*) ;; *) continue ;; esac
  spy="$(dirname "$exe")/py-spy"; [ -x "$spy" ] || spy=$(command -v py-spy) || {{
    echo "py-spy is not installed on this worker (pip install py-spy)"; exit 0; }}
  echo "py-spy dump --pid $p"; "$spy" dump --pid "$p" 2>&1; found=1
done
[ $found = 1 ] || echo "no Python process in the job's session"
"""
    r = transport.run(w, script, timeout=60)
    return r.stdout
