"""Usage errors typed at the real entry point: one line, exit 2, never a traceback, for every command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from tpuops.cli import app

# The console script a user types; beside a bare interpreter (a throwaway venv checking another typer), -m.
_SCRIPT = shutil.which("tpuops", path=str(Path(sys.executable).parent))
ENTRY = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "tpuops"]


def _commands() -> list[list[str]]:
    """Every command path of the app (`vm list`, `sop run`, ...), walked from the Typer tree."""
    found: list[list[str]] = []

    def walk(cmd: object, path: list[str]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                walk(sub, [*path, name])
        else:
            found.append(path)

    walk(typer.main.get_command(app), [])
    return found


def tpuops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ENTRY, *args], cwd=cwd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "200"}, check=False,
    )  # fmt: skip


def _one_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    return lines[0]


@pytest.mark.parametrize("command", _commands(), ids=" ".join)
def test_a_mistyped_option_is_one_line_and_exit_2(command: list[str], tmp_path: Path) -> None:
    line = _one_line(tpuops(*command, "--bogus", cwd=tmp_path))
    assert line.startswith("error: No such option: --bogus") and f"{command[-1]} --help" in line, line


@pytest.mark.parametrize(
    "argv, says",
    [
        (["vm", "describe"], "Missing argument"),  # a required argument
        (["vm", "create", "x"], "Missing option '--accelerator'"),  # a required option
        (["vm", "list", "--zone"], "requires an argument"),
        (["sop", "run", "exec", "--local", "--parallel", "zero"], "Invalid value for '--parallel'"),
    ],
)
def test_missing_and_malformed_options_are_one_line_and_exit_2(
    argv: list[str], says: str, tmp_path: Path
) -> None:
    assert says in _one_line(tpuops(*argv, cwd=tmp_path))


def test_a_usage_error_under_json_is_json_on_stdout(tmp_path: Path) -> None:
    r = tpuops("sop", "run", "exec", "--local", "--json", "--bogus", cwd=tmp_path)
    _one_line(r)
    data = json.loads(r.stdout)
    assert (data["exit_code"], data["error_class"]) == (2, "usage") and "--bogus" in data["message"]


@pytest.mark.parametrize(
    "argv, says",
    [
        (["run", "grpo", "--vm", "v", "--local"], "--vm and --local were both given"),
        (["doctor", "--host", "me@192.0.2.1", "--local"], "--host and --local were both given"),
        (["bench", "rollout", "--local", "--hostkey", "SHA256:x"], "--hostkey needs --host or --vm"),
        (["sop", "run", "exec", "--vm", "v", "--key-ttl", "soon"], "--key-ttl 'soon' is not a duration"),
        (["fit", "tiny", "--accelerator", "v6e-8", "--topology", "v6e:2x4"], "pass one"),
    ],
)
def test_bad_input_found_inside_a_command_answers_in_json_under_json(
    argv: list[str], says: str, tmp_path: Path
) -> None:
    """--json is recorded before a command's body runs, so an error the library raises is JSON on stdout too."""
    r = tpuops(*argv, "--json", cwd=tmp_path)
    assert says in _one_line(r)
    data = json.loads(r.stdout)
    assert (data["ok"], data["exit_code"], data["error_class"], data["error"]) == (False, 2, "usage", "usage")
    assert says in data["message"]
    plain = tpuops(*argv, cwd=tmp_path)  # without --json: the same line, nothing on stdout
    assert _one_line(plain) == _one_line(r) and plain.stdout == ""
