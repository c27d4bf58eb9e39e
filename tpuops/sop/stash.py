"""The stash of a worker's local edits before a git sync discards them: the shell that writes it, and the verdict
of one the disk could not hold."""

from __future__ import annotations

from tpuops.errors import NoSpaceError

# Exit code of a git_sync script whose stash of the worker's local edits ran out of disk (or quota).
NO_SPACE_EXIT = 76


def script(folder: str, run_id: str, kept: str) -> str:
    """git_sync's shell, run in the checkout when `$dirty` edits were found: each one named, then copied into
    `<folder>/<UTC time>-<run id>/` (`folder` and `run_id` shell words, `kept` the pathspecs left alone). A copy the
    disk cannot hold is removed and the script ends (NO_SPACE_EXIT, a `tpuops: nospace` line) before the reset."""
    return f"""if [ "$dirty" != 0 ]; then  # nothing typed on a worker is lost silently: named, then kept outside the checkout
  stash={folder}/$(date -u +%Y%m%d-%H%M%S)-{run_id}
  edited() {{ git diff --name-only -z HEAD -- . {kept}; git ls-files -z --others --exclude-standard -- . {kept}; }}
  if ! err=$(export LC_ALL=C; {{ mkdir -p "$stash/files" &&
      git status --porcelain --untracked-files=all -- . {kept} > "$stash/status.txt" &&
      git diff --binary HEAD -- . {kept} > "$stash/tracked.patch" &&
      edited | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$stash/files"; }} 2>&1); then
    # A stash cut short is removed (it would only keep the disk full) and the checkout is not reset: every
    # edit is still where it was.
    rm -rf "$stash"
    at=$(dirname "$stash"); [ -d "$at" ] || at=$HOME
    free=unknown; if fs=$(stat -f -c '%a %S' "$at"); then set -- $fs; free=$(( $1 * $2 )); fi
    need=$(edited | xargs -0 -r du -cb -- 2>/dev/null | tail -n 1 | cut -f1); need=${{need:-0}}
    full=0; case $err in *"No space left on device"*|*"Disk quota exceeded"*) full=1 ;; esac
    [ "$free" != unknown ] && [ "$free" -lt "$need" ] && full=1
    if [ $full = 1 ]; then echo "tpuops: nospace free=$free need=$need path=$stash"; exit {NO_SPACE_EXIT}; fi
    echo "could not stash the local edits to $stash (the checkout was not reset): $err" >&2; exit 1
  fi
  sed 's/^/tpuops: discard /' "$stash/status.txt"
  echo "tpuops: stashed n=$dirty dir=$stash"
fi"""


def no_space(found: list[dict[str, str]]) -> NoSpaceError:
    """git_sync's stash ran out of disk: where, how many bytes were free there, what the edits need."""
    m = next((x for x in found if x["_"].startswith("nospace")), {"_": ""})
    path = m["_"].partition(" path=")[2] or "the stash"  # the last field: a path may hold spaces
    free, need = (int(m[k]) if m.get(k, "").isdigit() else None for k in ("free", "need"))
    room = "" if free is None else f"{free:,} bytes free"
    if need:
        room += f"{'; ' if room else ''}the local edits take {need:,} bytes"
    return NoSpaceError(
        f"no space left on device stashing the local edits to {path}"
        + (f" ({room})" if room else "")
        + ": the partial stash was removed and the checkout was not reset",
        hint="free space on the worker, or remove the edits there yourself, then run again",
    )
