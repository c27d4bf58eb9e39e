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
        cmd=yaml.safe_dump(words, default_flow_style=True, width=10_000).strip(),
        description=f"Runs `{shlex.join(words)}` in this repository on every worker.",
    )
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    try:
        loader.load(path)  # what we wrote must load: a broken starting point helps nobody
    except UsageError:
        path.unlink()
        raise
    shadows = (loader.sops_dir() / f"{name}.yaml").exists()
    return path, f"it shadows the built-in SOP {name!r} wherever {folder} is found" if shadows else None


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
