"""`tpuops sop new NAME [-- CMD]`: a commented starting SOP for the user's own command, written into their sops/."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import yaml

from tpuops.errors import UsageError
from tpuops.sop import loader

NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")

TEMPLATE = """\
# {name}: your own command as a SOP (written by `tpuops sop new {name}`; edit freely, then check it with
# `tpuops sop show {name}` and `tpuops run {name} --dry-run`). Reference: docs/sops.md.
#
#   tpuops run {name} --local                          # on this machine
#   tpuops run {name} --vm my-tpu-vm                   # every worker of a TPU VM (or --host user@ip ...)
#   tpuops run {name} --vm my-tpu-vm -- python -u scripts/other.py --flag   # another command, same SOP
#
# It extends the bundled `job` SOP: the repository is this checkout's origin at its pushed HEAD; the Python
# environment is chosen by what the repository has (pyproject.toml, requirements*.txt, uv.lock), or
# --set requirements=FILE / python=/path/bin/python / conda_env=NAME; the command starts detached on every
# worker with that environment's bin/ first on PATH, is followed, and its step lines are reported.
name: {name}
extends: job
description: |
  {description}
params:
  # The command, word for word (what `-- CMD ...` on the command line replaces).
  cmd: {{default: {cmd}}}
  # Your script's own options per run: tpuops run {name} --set args='--set steps=3 --lr 1e-4' (appended to cmd).
  args: {{default: []}}
  # Environment of the command (never secrets: those belong in .env, which is sent to every worker).
  env: {{default: []}}
  # Where the Python environment comes from (uncomment one):
  # requirements: {{default: requirements-tpu.txt}}
  # conda_env: {{default: my-env}}
  # python: {{default: /root/miniconda3/envs/my-env/bin/python}}
  # extras: {{default: "tpu"}}          # with a pyproject.toml: pip install -e .[tpu]
scan:
  source: log
  warmup: 1                  # steps whose compiles are expected
  fail_on_recompile: false   # true: exit 7 on compiles after the warm-up, 13 if no step/compile line was seen
  # Your step lines, if tpuops does not read them already (step=N, step: N, Step N/M, [step N]):
  # step_pattern: '^iter (?P<step>\\d+) .* took (?P<dt>[0-9.]+)s'
"""


def write(name: str, command: list[str], cwd: Path) -> tuple[Path, str | None]:
    """Write sops/NAME.yaml (the user's SOP folder, else sops/ at the top of this checkout); returns the path and
    a note when it shadows a built-in. Refuses to overwrite (exit 2)."""
    if not NAME.fullmatch(name):
        raise UsageError(
            f"SOP name {name!r}: lower-case letters, digits, '-' and '_' only", hint="for example train-small"
        )
    folder = loader.user_sops_dir(cwd) or _top(cwd) / "sops"
    path = folder / f"{name}.yaml"
    if path.exists():
        raise UsageError(f"{path} exists", hint="edit it, or pick another name")
    words = command or ["python", "-u", "scripts/train.py"]
    text = TEMPLATE.format(
        name=name,
        cmd=_flow(words),
        description=_visible(f"Runs `{shlex.join(words)}` in this repository on every worker."),
    )
    _check(name, text, words)  # before any file is touched
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with path.open("x") as f:  # never over a file made since the check above
            f.write(text)
    except FileExistsError:
        raise UsageError(f"{path} exists", hint="edit it, or pick another name") from None
    try:
        loader.load(path)  # beside the user's own SOPs (`extends: job` may find theirs)
    except UsageError as e:
        path.unlink()
        if made:
            folder.rmdir()
        raise UsageError(
            f"sop new {name}: the SOP would not load beside your SOPs in {folder}: {e.line()}"
        ) from None
    shadows = (loader.sops_dir() / f"{name}.yaml").exists()
    return path, f"it shadows the built-in SOP {name!r} wherever {folder} is found" if shadows else None


def _flow(words: list[str]) -> str:
    """The command as one YAML flow list that reads back word for word: plain where every word is printable,
    else every word double-quoted with escapes (a newline or a tab inside a word stays on one line)."""
    if all(w.isprintable() for w in words):
        return yaml.safe_dump(words, default_flow_style=True, width=10_000).strip()
    return yaml.safe_dump(words, default_flow_style=True, default_style='"', width=10_000).strip()


def _visible(text: str) -> str:
    """One line of text for the description: control characters (a newline in a word) shown as escapes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def _check(name: str, text: str, words: list[str]) -> None:
    """The SOP as it would be written loads and carries the command word for word (else exit 2, nothing written)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tpuops-sop-new-") as tmp:
        trial = Path(tmp) / f"{name}.yaml"
        trial.write_text(text)
        try:
            sop = loader.load(trial)
        except UsageError as e:
            raise UsageError(f"sop new {name}: the command cannot be written as a SOP: {e.line()}") from None
    given = sop.params["cmd"].default if "cmd" in sop.params else None
    if given != words:
        raise UsageError(
            f"sop new {name}: the command does not read back word for word from YAML",
            hint="write the SOP by hand (docs/sops.md), or pass the command after `--` when you run it",
        )


def _top(cwd: Path) -> Path:
    """The top of the checkout `cwd` is in (the SOP travels with the repository), else `cwd`."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return cwd
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else cwd
