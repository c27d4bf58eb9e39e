"""The small lines a daily user reads: routine notes only with -v, fit/cost lines without a `tpu-api` prefix,
the version's commit, exit 13 not told to run what it ran, the fit cache's word and speed, `top`'s `q`."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import termios
import threading
import time
from pathlib import Path

import pytest

from tpuops import console
from tpuops.checks import fit
from tpuops.cli import checkout_commit
from tpuops.errors import ExitCode
from tpuops.logs.scanner import LogScanner
from tpuops.run import logreport
from tpuops.run.top import quit_pressed

REPO = Path(__file__).resolve().parents[2]


def _printed(fn: object, *args: object) -> str:
    with console.err.capture() as got:
        fn(*args)  # type: ignore[operator]
    return got.get()


def test_a_routine_note_shows_only_with_verbose() -> None:
    routine = console.Routine("demo: metadata keys: root's key is in the VM's ssh-keys; nothing to add")
    try:
        assert _printed(console.note, routine) == ""
        assert _printed(console.note, "zone us-east1-d: retry 1/5") == "tpu-api zone us-east1-d: retry 1/5\n"
        console.verbose(True)
        assert _printed(console.note, routine) == f"tpu-api {routine}\n"
    finally:
        console.verbose(False)
    assert _printed(console.say, "fit: grpo on v6e-8 fits") == "fit: grpo on v6e-8 fits\n"  # its own subject


def test_the_commit_is_read_from_a_checkout_worktree_and_packed_refs(tmp_path: Path) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    assert checkout_commit(REPO) == head.stdout.strip()  # this checkout, whichever kind it is
    sha = "b311fa1" + "0" * 33
    root = tmp_path / "wt"
    (root / "tpuops").mkdir(parents=True)
    (root / "pyproject.toml").write_text("")
    main = tmp_path / "main.git"
    (main / "worktrees" / "wt").mkdir(parents=True)
    (root / ".git").write_text(f"gitdir: {main / 'worktrees' / 'wt'}\n")
    (main / "worktrees" / "wt" / "HEAD").write_text("ref: refs/heads/wt\n")
    (main / "worktrees" / "wt" / "commondir").write_text("../..\n")
    (main / "packed-refs").write_text(f"# pack-refs with: peeled\n{sha} refs/heads/wt\n")
    assert checkout_commit(root) == sha
    (main / "worktrees" / "wt" / "HEAD").write_text("ref: refs/heads/gone\n")
    assert checkout_commit(root) is None
    assert checkout_commit(tmp_path / "site-packages") is None  # an install from a wheel: no commit


def test_exit_13_does_not_tell_a_recompile_check_to_run_a_recompile_check() -> None:
    scanner = LogScanner()
    for i in range(3):
        scanner.feed(f"step={i} dt=0.5s")
    report = scanner.close()
    unverified = _printed(logreport.render, report, int(ExitCode.UNVERIFIED), False, None, None)
    assert "compiles: not logged" in unverified and "recompile-check" not in unverified
    plain = _printed(logreport.render, report, 0, False, None, None)
    assert "`tpuops recompile-check`" in plain  # a plain run's report still says how to turn logging on


def test_a_cached_fit_verdict_says_so_and_is_answered_at_once(tmp_path: Path, tpuops_home: Path) -> None:
    verdict = {"fits": True, "config": "grpo_tiny", "accelerator": "v6e-8", "phases": {}}
    key = fit.cache_key("grpo_tiny", ["train.steps=3"], "accelerator=v6e-8", REPO)
    (tpuops_home / "fit").mkdir(parents=True)
    (tpuops_home / "fit" / f"{key}.json").write_text(json.dumps(verdict))
    t0 = time.monotonic()
    result = fit.check("grpo_tiny", ["train.steps=3"], accelerator="v6e-8", cwd=REPO)
    took = time.monotonic() - t0
    assert result["cached"] and took < 2.0, took  # the cache is read before anything compiles
    words = fit.cached_words(result, "v6e-8")
    assert words.startswith(" (cached verdict for this config and v6e-8, compiled 20")
    assert "`tpuops fit --no-cache` compiles again" in words
    assert fit.cached_words({**result, "cached": False}, "v6e-8") == ""


@pytest.fixture
def terminal() -> tuple[int, int]:
    main, child = pty.openpty()
    yield main, child
    os.close(main)
    os.close(child)


def test_top_ends_on_q_and_leaves_the_terminal_as_it_was(terminal: tuple[int, int]) -> None:
    main, child = terminal
    before = termios.tcgetattr(child)
    assert quit_pressed(0.2, fd=child) is False  # no key: the next snapshot after the interval
    threading.Timer(0.2, os.write, (main, b"xq")).start()
    t0 = time.monotonic()
    assert quit_pressed(30, fd=child) is True and time.monotonic() - t0 < 5
    assert termios.tcgetattr(child) == before
