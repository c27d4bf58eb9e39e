"""The shell that installs, updates or turns off the autostop watcher (sop/autostop_watch.py) on a VM's worker 0:
the watcher and its config written to `~/.tpuops-autostop/`, the watcher started detached when none runs."""

from __future__ import annotations

import json
from importlib import resources

from tpuops import shell

DIR = "$HOME/.tpuops-autostop"
WATCHING, OFF, NO_PYTHON = "tpuops: autostop watching", "tpuops: autostop off", "tpuops: autostop no python3"


def install_script(config: dict[str, object]) -> str:
    """Idempotent: the watcher file is rewritten only when it changed; a watcher already running reads the new
    config at its next poll (a second one started meanwhile ends at once: the first holds the lock)."""
    source = resources.files("tpuops.sop").joinpath("autostop_watch.py").read_text()
    text = json.dumps(config, sort_keys=True)
    return f"""d="{DIR}"; mkdir -p "$d" && chmod 700 "$d" || exit 1
cat > "$d/watch.py.new" <<'TPUOPS_AUTOSTOP_WATCH'
{source.rstrip()}
TPUOPS_AUTOSTOP_WATCH
if cmp -s "$d/watch.py.new" "$d/watch.py"; then rm -f "$d/watch.py.new"; else mv -f "$d/watch.py.new" "$d/watch.py"; fi
printf '%s\\n' {shell.quote(text)} > "$d/config.json.new" && mv -f "$d/config.json.new" "$d/config.json" || exit 1
if ! p3=$(command -v python3); then echo "{NO_PYTHON}"; exit 0; fi
(cd "$d" && setsid nohup "$p3" "$d/watch.py" "$d" >> "$d/log" 2>&1 < /dev/null &)
echo "{WATCHING}"
"""


def off_script() -> str:
    """Turned off: the config removed (the watcher ends at its next poll)."""
    return f'rm -f "{DIR}/config.json"; echo "{OFF}"'
