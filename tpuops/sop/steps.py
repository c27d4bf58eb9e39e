"""Step kinds that prepare a worker: git_sync, clear_lockfile, sync_env, shell."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import ClassVar, Literal

from tpuops import shell
from tpuops.errors import UsageError
from tpuops.sop.actions import Action, Command, Upload
from tpuops.sop.model import Outcome, PlanContext, Step, markers
from tpuops.sop.stash import NO_SPACE_EXIT, no_space
from tpuops.sop.stash import script as stash_script
from tpuops.transport.base import CmdResult, Kind

# Exit code of a clear_lockfile script that found a holder and was not allowed to kill it.
BUSY_EXIT = 75
# Exit code of a git_sync script given a branch or commit the remote does not have (bad input: exit 2).
UNKNOWN_REF_EXIT = 2
_DEVICE_GLOB = re.compile(r"[A-Za-z0-9_./*?-]+")


class GitSync(Step):
    """Clone if missing, fetch, check out a branch or commit, reset --hard, clean (keeping .env and logs), then
    apply `patch` (the user's uncommitted change) on top, so the worker has the files the user sees.

    What the reset and clean would discard (modified tracked files, untracked ones) is named first and copied
    into `<stash>/<UTC time>-<run id>/` outside the checkout: `status.txt` (git status), `tracked.patch`
    (`git diff --binary HEAD`, deletions included) and `files/` (each changed or untracked file as it was).
    A patch tpuops applied itself is recorded in `.git/tpuops-tree` (its id and the tree's fingerprint): the
    next sync recognises those files as its own, not a person's edits, and stashes nothing.

    With `bundle` (a local `git bundle`: the bundled trainer on a VM), it is sent first, beside the checkout
    (`<dir>.bundle`), and the worker clones and fetches from it instead of `repo`.
    """

    kind: Literal["git_sync"] = "git_sync"
    repo: str
    ref: str = "main"
    dir: str = "~/tpuops/repo"
    patch: str = ""  # a local patch file (git diff --binary) applied after the reset
    bundle: str = ""  # a local git bundle sent first and synced from (a repository no worker can reach)
    keep: list[str] = [".env", "runs/", ".venv/"]
    stash: str = "~/tpuops/stash"
    timeout: float = 600.0
    template_fields: ClassVar[tuple[str, ...]] = ("repo", "ref", "dir", "patch", "bundle", "keep", "stash")
    preview_words: ClassVar[tuple[str, str]] = (
        "would discard (copied to the stash first)",
        "no local changes to discard",
    )

    def _local(self, ctx: PlanContext, name: Literal["patch", "bundle"]) -> tuple[Path, str] | None:
        """The local file the field `name` names (none when empty) and its short sha256."""
        raw = ctx.raw(getattr(self, name))
        if not raw:
            return None
        path = Path(raw).expanduser()
        if not path.is_file():
            raise ValueError(f"{name} {raw}: no such file")
        return path, hashlib.sha256(path.read_bytes()).hexdigest()[:12]

    def _fingerprint(self, kept: str) -> str:
        """A shell function: one hash of the tree's difference from HEAD (tracked and untracked files)."""
        return (
            "fp() { { git diff --binary HEAD -- . " + kept + "; git ls-files -z --others --exclude-standard -- . "
            + kept + " | xargs -0 -r sha256sum --; } | sha256sum | cut -c1-64; }"
        )  # fmt: skip

    def plan(self, ctx: PlanContext) -> list[Action]:
        keep = [ctx.raw(k) for k in self.keep]
        excludes = " ".join(f"-e {shell.quote(k)}" for k in keep)
        kept = " ".join(shell.quote(f":(exclude){k}") for k in keep)
        patch, bundle = self._local(ctx, "patch"), self._local(ctx, "bundle")
        want = patch[1] if patch else "none"
        sent = ctx.raw(self.dir).rstrip("/") + ".bundle"  # where a bundle goes: beside the checkout
        repo = shell.path(sent) if bundle else shell.quote(ctx.raw(self.repo))
        script = f"""set -e
dir={shell.path(ctx.raw(self.dir))}; repo={repo}; ref={shell.quote(ctx.raw(self.ref))}
{self._fingerprint(kept)}
cloned=0
if [ ! -d "$dir/.git" ]; then mkdir -p "$(dirname "$dir")"; git clone --quiet -- "$repo" "$dir"; cloned=1; fi
cd "$dir"
git remote set-url origin "$repo"
before=$(git rev-parse --verify --quiet HEAD || echo none)
dirty=$(git status --porcelain --untracked-files=all -- . {kept} | grep -c . || true)
prev=none  # the patch tpuops applied last time, when the tree is still exactly that
if [ -f .git/tpuops-tree ]; then
  read -r id mark < .git/tpuops-tree || true
  if [ "$dirty" = 0 ] || [ "$(fp)" = "$mark" ]; then [ "$dirty" = 0 ] || prev=$id; dirty=0; fi
fi
git fetch --all --prune --quiet
refs() {{ {{ git for-each-ref --format='%(refname:lstrip=3)' refs/remotes/origin | grep -vx HEAD
  git for-each-ref --format='%(refname:lstrip=2)' refs/tags; }} | head -n 20 | paste -sd, - | sed 's/,/, /g'; }}
# A commit no branch reaches (a pull request's merge commit, which CI checks out) is fetched by itself:
# by its full SHA, or by the ref CI names (refs/pull/N/merge).
if git rev-parse --verify --quiet "refs/remotes/origin/$ref^{{commit}}" >/dev/null; then target="origin/$ref"
elif target=$(git rev-parse --verify --quiet "$ref^{{commit}}"); then :
elif git fetch --quiet origin "$ref" 2>/dev/null && target=$(git rev-parse --verify --quiet "FETCH_HEAD^{{commit}}"); then :
else echo "unknown branch or commit: $ref (branches and tags found: $(refs))" >&2; exit {UNKNOWN_REF_EXIT}; fi
{stash_script(shell.path(ctx.raw(self.stash)), shell.quote(ctx.run_id or "sync"), kept)}
git checkout --quiet --force --detach "$target"
git reset --quiet --hard "$target"
git clean -fdq {excludes}
rm -f .git/tpuops-tree
after=$(git rev-parse HEAD)
changed=1; [ "$cloned" = 0 ] && [ "$before" = "$after" ] && [ "$dirty" = 0 ] && [ "$prev" = {want} ] && changed=0
echo "tpuops: sha=$(git rev-parse --short=7 HEAD) changed=$changed"
"""
        what = f"check out {ctx.raw(self.ref)} of {ctx.raw(self.repo)} in {ctx.raw(self.dir)} (local edits stashed first)"
        actions: list[Action] = [Upload(bundle[0], sent, 0o600, bundle[1], plain=True)] if bundle else []
        actions.append(Command(script, timeout=self.timeout, what=what))
        if patch is not None:
            remote = f"{ctx.raw(self.dir).rstrip('/')}/.git/tpuops-tree.patch"
            actions.append(Upload(patch[0], remote, 0o600, want, plain=True))
            applied = f"apply the uncommitted change (patch {want}) on top"
            actions.append(Command(self._apply(ctx, kept, want), timeout=self.timeout, what=applied))
        return actions

    def _apply(self, ctx: PlanContext, kept: str, want: str) -> str:
        return f"""set -e
cd {shell.path(ctx.raw(self.dir))}
{self._fingerprint(kept)}
if ! out=$(git apply --binary --whitespace=nowarn .git/tpuops-tree.patch 2>&1); then
  echo "the uncommitted change (patch {want}) does not apply to $(git rev-parse --short=7 HEAD): $out" >&2; exit 1
fi
rm -f .git/tpuops-tree.patch
echo "{want} $(fp)" > .git/tpuops-tree
echo "tpuops: applied patch={want}"
"""

    def preview(self, ctx: PlanContext) -> list[Action]:
        """`git status` of the checkout, read-only: each modified tracked and untracked file the reset and clean
        would discard (and stash first), as the run would name them; none when the tree is a patch tpuops
        applied itself."""
        kept = " ".join(shell.quote(f":(exclude){ctx.raw(k)}") for k in self.keep)
        script = f"""dir={shell.path(ctx.raw(self.dir))}
{self._fingerprint(kept)}
if [ -d "$dir/.git" ]; then cd "$dir"
  if [ -f .git/tpuops-tree ] && read -r id mark < .git/tpuops-tree && [ "$(fp)" = "$mark" ]; then exit 0; fi
  git status --porcelain --untracked-files=all -- . {kept} | sed 's/^/tpuops: discard /'
else echo "tpuops: absent"; fi
"""
        return [Command(script, timeout=30)]

    def previewed(self, results: list[CmdResult]) -> list[str]:
        out = results[-1].stdout.splitlines() if results else []
        return [line.removeprefix("tpuops: discard ") for line in out if line.startswith("tpuops: discard ")]

    def outcome(self, results: list[CmdResult]) -> Outcome:
        # The sync script's result first: a bundle's upload before it (ok, silent) is not the sync.
        while len(results) > 1 and results[0].ok and not (results[0].stdout or results[0].stderr):
            results = results[1:]
        sync = results[0] if results else None
        if sync is not None and sync.kind is Kind.EXIT and sync.exit_code == UNKNOWN_REF_EXIT:
            lines = sync.stderr.strip().splitlines()
            raise UsageError(
                lines[-1] if lines else "unknown branch or commit", hint="pass --set branch=NAME"
            )
        if sync is not None and sync.kind is Kind.EXIT and sync.exit_code == NO_SPACE_EXIT:
            raise no_space(markers(sync.stdout))
        if not results or not all(r.ok for r in results):
            return super().outcome(results)
        found = markers(results[0].stdout)
        if not found:
            return super().outcome(results)
        m = found[-1]
        status = "changed" if m.get("changed") == "1" else "nothing"
        data: dict[str, object] = {"sha": m["sha"]}
        at = f"at {m['sha']}"
        applied = next((x["patch"] for r in results[1:] for x in markers(r.stdout) if "patch" in x), None)
        if applied:
            data["patch"] = applied
            at += f" + uncommitted (patch {applied})"
        discarded = [
            line.removeprefix("tpuops: discard ")
            for line in results[0].stdout.splitlines()
            if line.startswith("tpuops: discard ")
        ]
        stash = next((x["dir"] for x in found if x["_"].startswith("stashed")), None)
        if not discarded or stash is None:
            return Outcome(status, at, data)
        shown = ", ".join(d.strip() for d in discarded[:5]) + (
            f" and {len(discarded) - 5} more" if len(discarded) > 5 else ""
        )
        detail = f"{at}; local changes stashed to {stash} before the reset: {shown}"
        return Outcome(status, detail, {**data, "discarded": discarded, "stash": stash})


class ClearLockfile(Step):
    """Report who holds the TPU; refuse while a holder runs unless forced; then kill, wait, remove the lock.

    A holder is a process with a TPU device file open (found through /proc/*/fd, as `lsof -w /dev/accel*`
    would) or with the lockfile open. Never a name: on a machine with no TPU device file nothing is a holder,
    so another job that merely looks like a trainer is never refused for, or killed.
    """

    kind: Literal["clear_lockfile"] = "clear_lockfile"
    lockfile: str = "/tmp/libtpu_lockfile"
    # TPU device files: /dev/accel* on v2-v4, /dev/vfio/* on v5e/v5p/v6e (tests point these at a temp dir).
    devices: list[str] = ["/dev/accel*", "/dev/vfio/*"]
    grace_s: float = 10.0
    template_fields: ClassVar[tuple[str, ...]] = ("lockfile", "devices")

    def plan(self, ctx: PlanContext) -> list[Action]:
        lock = ctx.raw(self.lockfile)
        what = f"clear the TPU lock {lock} when no process holds the TPU" + (
            " (--force: stop holders)" if ctx.force else ""
        )
        return [Command(self._script(ctx, act=True), timeout=self.grace_s + 30, what=what)]

    def check(self, ctx: PlanContext) -> list[Action]:
        """Who holds the TPU, before anything changes: a holder refuses the start (unless --force)."""
        what = f"look for processes holding the TPU (lock {ctx.raw(self.lockfile)})"
        return [Command(self._script(ctx, act=False), timeout=30, what=what)]

    def check_outcome(self, results: list[CmdResult]) -> Outcome:
        out = self.outcome(results)
        return out if out.status == "busy" or not results or not results[-1].ok else Outcome("ok")

    def _script(self, ctx: PlanContext, *, act: bool) -> str:
        force = "1" if ctx.force else "0"
        globs = [g for d in self.devices for g in ctx.raw(d).split()]  # a list parameter: one glob a word
        # Globs stay unquoted in `for d in ...` (they must expand) but are checked to hold no shell syntax.
        for g in globs:
            if not _DEVICE_GLOB.fullmatch(g):
                raise UsageError(
                    f"clear_lockfile devices: {g!r} is not a plain path glob (letters, digits, /._-*?)"
                )
        patterns = "|".join(globs)
        script = f"""{shell.ALIVE}
lock={shell.path(ctx.raw(self.lockfile))}
force={force}; grace={int(self.grace_s * 10)}
tpu=0; for d in {" ".join(globs)}; do [ -e "$d" ] && tpu=1 && break; done
holders=""
if [ $tpu = 1 ]; then
for p in /proc/[0-9]*; do
  pid=${{p#/proc/}}; [ "$pid" = "$$" ] && continue
  [ -O "$p" ] || continue  # only our own processes: we could neither see their fds nor stop them
  why=""
  for fd in "$p"/fd/*; do
    t=$(readlink "$fd" 2>/dev/null) || continue
    case "$t" in {patterns}) why=device; break;; "$lock") why=lockfile; break;; esac
  done
  [ -n "$why" ] || continue
  cmd=$(tr '\\0' ' ' < "$p/cmdline" 2>/dev/null) || continue
  holders="$holders $pid"
  echo "tpuops: holder pid=$pid why=$why cmd=$(printf '%s' "$cmd" | cut -c1-120)"
done
fi
if [ -e "$lock" ]; then echo "tpuops: lock age=$(( $(date +%s) - $(stat -c %Y "$lock") ))s"; fi
if [ -z "$holders" ] && [ ! -e "$lock" ]; then echo "tpuops: nothing to do"; exit 0; fi
if [ -n "$holders" ] && [ "$force" != 1 ]; then echo "TPU is held by pid$holders" >&2; exit {BUSY_EXIT}; fi
{"" if act else "exit 0  # a check only: stopping and removing is the step's own work" + chr(10)}if [ -n "$holders" ]; then
  kill -TERM $holders 2>/dev/null
  i=0; while [ $i -lt $grace ]; do left=""; for h in $holders; do alive "$h" && left="$left $h"; done
    [ -z "$left" ] && break; sleep 0.1; i=$((i+1)); done
  for h in $holders; do alive "$h" && kill -KILL "$h" 2>/dev/null; done
  for h in $holders; do while alive "$h"; do sleep 0.05; done; echo "tpuops: killed pid=$h"; done
fi
rm -f "$lock" && echo "tpuops: removed lock"
"""
        return script

    def outcome(self, results: list[CmdResult]) -> Outcome:
        r = results[-1]
        found = markers(r.stdout)
        holders = [m["_"] for m in found if m["_"].startswith("holder")]
        if r.kind is Kind.EXIT and r.exit_code == BUSY_EXIT:
            return Outcome("busy", "; ".join(holders) + " (use --force to stop them)", {"holders": holders})
        if not r.ok:
            return super().outcome(results)
        if any(m["_"] == "nothing to do" for m in found):
            return Outcome("nothing", "no holder, no lockfile")
        killed = [m["pid"] for m in found if "killed" in m["_"]]
        detail = f"killed {', '.join(killed)}; " if killed else ""
        return Outcome("changed", detail + "lockfile removed", {"killed": killed})


class SyncEnv(Step):
    """Send the local .env to each worker over SFTP with mode 0600 (nothing to do when already identical).

    With no local .env the worker's old one is removed, so a job never sources stale secrets. The file sent is
    `secrets.serialize` of the local values: `set -a; . .env` and python-dotenv read back exactly those.
    """

    kind: Literal["sync_env"] = "sync_env"
    source: str = ".env"
    dest: str = "~/tpuops/repo/.env"
    required: bool = False  # a missing source is bad input (exit 2); so is an env_file named with --set
    template_fields: ClassVar[tuple[str, ...]] = ("source", "dest")

    def local_path(self, ctx: PlanContext) -> Path:
        p = Path(ctx.raw(self.source)).expanduser()
        return p if p.is_absolute() else ctx.local_dir / p

    def plan(self, ctx: PlanContext) -> list[Action]:
        src, dest = self.local_path(ctx), shell.path(ctx.raw(self.dest))
        if not src.exists():
            return [
                Command(
                    f"if [ -e {dest} ]; then rm -f {dest} && echo 'tpuops: removed env_sha=none'; "
                    "else echo 'tpuops: nothing env_sha=none'; fi",
                    what=f"no local {src.name}: remove {ctx.raw(self.dest)} if the worker has one",
                )
            ]
        from tpuops.config.secrets import normalized_env_bytes  # light: python-dotenv only

        digest = hashlib.sha256(normalized_env_bytes(src)).hexdigest()
        check = Command(
            f"echo 'tpuops: env_sha={digest[:12]}'; "
            f'if [ -f {dest} ] && [ "$(sha256sum < {dest} | cut -c1-64)" = {digest} ]; '
            f"then echo 'tpuops: same'; fi",
            what=f"compare {ctx.raw(self.dest)} with the local {src.name} (sha256 {digest[:12]})",
        )
        return [check, Upload(src, ctx.raw(self.dest), 0o600, digest[:12])]

    def outcome(self, results: list[CmdResult]) -> Outcome:
        found = markers(results[0].stdout) if results else []
        data: dict[str, object] = {k: m[k] for m in found for k in ("env_sha",) if k in m}
        if any(m["_"].startswith("removed") for m in found):
            return Outcome("changed", "no local .env: removed the worker's old .env", data)
        if any(m["_"].startswith("nothing") for m in found):
            return Outcome("nothing", "no local .env", data)
        if any(m["_"] == "same" for m in found):
            return Outcome("nothing", "already identical", data)
        if not results or not results[-1].ok:
            return super().outcome(results)
        # The upload's result carries what reading the local file fixed ("tpuops: fixed CRLF line endings").
        fixed = [
            m["_"] for m in markers(results[-1].stdout) if m["_"].startswith(("fixed ", "not redacted "))
        ]
        return Outcome("changed", "; ".join(["sent (mode 0600)", *fixed]), data)


class Shell(Step):
    """A command with environment variables; values travel over stdin and are never echoed."""

    kind: Literal["shell"] = "shell"
    command: str
    cwd: str | None = None
    env: dict[str, str] = {}
    secret_env: list[str] = []  # names taken from the local .env
    timeout: float | str | None = 600.0  # seconds, or a template such as "{timeout}"
    # Show every line the command prints, prefixed by its worker, and keep it (bounded) in the report.
    output: bool = False
    template_fields: ClassVar[tuple[str, ...]] = ("command", "cwd", "env", "timeout")

    def plan(self, ctx: PlanContext) -> list[Action]:
        body = ctx.command(self.command)
        if self.cwd:
            body = f"cd {shell.path(ctx.raw(self.cwd))} && {body}"
        env = {**ctx.megascale_env(), **{k: ctx.raw(v) for k, v in self.env.items()}}
        timeout = ctx.number(self.timeout, "timeout")
        what = " ".join(body.split()) if len(body) <= 160 and "\n" not in body.strip() else ""
        return [
            Command(
                body,
                env=env,
                secret_env=tuple(self.secret_env),
                timeout=timeout,
                stream=self.output,
                what=what,
            )
        ]

    def outcome(self, results: list[CmdResult]) -> Outcome:
        base = super().outcome(results)
        if not self.output or not results:
            return base
        last = results[-1]
        # The detail stays the last line (the table's cell); every line was shown live and is in `data`.
        data = {**base.data, **bounded("stdout", last.stdout), **bounded("stderr", last.stderr)}
        return Outcome(base.status, base.detail, data)


OUTPUT_LIMIT = 64 * 1024  # characters of a command's stdout/stderr kept per worker in the report


def bounded(name: str, text: str) -> dict[str, object]:
    """`{name: text}`, cut to its last OUTPUT_LIMIT characters with a note saying how much was left out."""
    if len(text) <= OUTPUT_LIMIT:
        return {name: text}
    return {
        name: text[-OUTPUT_LIMIT:],
        f"{name}_note": f"cut: only the last {OUTPUT_LIMIT} of {len(text)} characters are kept",
    }
