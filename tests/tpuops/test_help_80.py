"""At 80 columns: every command's --help and the common mistakes' error lines keep every id, name and example
whole (click cuts a short help with `...`; a table or a wrapped line could cut an id)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from tpuops.cli import app

RUN_ID = "20261126-162501-recompile-check-ab12"


def _commands(group: object, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, cmd in sorted(getattr(group, "commands", {}).items()):
        yield from _commands(cmd, (*path, name))


ALL = list(_commands(get_command(app)))


def test_every_command_is_covered() -> None:
    names = {" ".join(p) for p in ALL}
    assert {
        "",
        "run",
        "runs",
        "attach",
        "doctor",
        "vm list",
        "vm create",
        "sop list",
        "fit",
        "report",
    } <= names


@pytest.mark.parametrize("path", ALL, ids=lambda p: " ".join(p) or "tpuops")
def test_help_at_80_columns_cuts_nothing(path: tuple[str, ...]) -> None:
    r = CliRunner().invoke(
        app, [*path, "--help"], prog_name="tpuops", terminal_width=80, env={"COLUMNS": "80"}
    )
    assert r.exit_code == 0, r.output
    text = r.output
    assert "…" not in text
    listed = text.split("Commands:", 1)[1] if "Commands:" in text else ""
    assert not [
        ln for ln in listed.splitlines() if ln.rstrip().endswith("...")
    ]  # click's cut of a short help
    for line in text.splitlines():  # wrapped to 80; an example (a `\b` block) is kept whole, however long
        assert len(line) <= 80 or line.lstrip().startswith(("tpuops ", "-- ")), line
    for example in (ln.strip() for ln in text.splitlines() if ln.strip().startswith("tpuops ")):
        assert example in text  # each example on one line: copied, it runs


def _tpuops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "80"}, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "whole"),
    [
        (["logs", RUN_ID], RUN_ID),
        (["attach", RUN_ID, "--json"], RUN_ID),
        (["stop", RUN_ID], RUN_ID),
        (["sop", "show", "no-such-sop-named-like-this"], "no-such-sop-named-like-this"),
        (["run", "grpo", "--set", "steps", "3", "--local"], "--set steps=3"),
        (["vm", "describe", "Bad_Name_With_Capitals"], "Bad_Name_With_Capitals"),
    ],
)
def test_a_common_mistake_is_one_line_with_the_id_whole(argv: list[str], whole: str, tmp_path: Path) -> None:
    r = _tpuops(*argv, cwd=tmp_path)
    assert r.returncode != 0
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert whole in line and "…" not in line and "http://" not in line, r.stderr
