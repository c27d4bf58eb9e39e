"""tpuops' own exit codes for interruption: 130 after SIGINT, 143 after SIGTERM (README's table has both)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.tpuops.test_usage_errors import ENTRY
from tpuops.errors import EXIT_CODES, ExitCode, error_class


def test_interruption_codes_are_in_the_table() -> None:
    assert (int(ExitCode.INTERRUPTED), error_class(130)) == (130, "interrupted")
    assert (int(ExitCode.TERMINATED), error_class(143)) == (143, "terminated")
    assert {130, 143} <= {int(c) for c in EXIT_CODES}


def test_sigterm_ends_tpuops_with_143_even_mid_command(tmp_path: Path) -> None:
    """A real `tpuops sop run exec --local` mid-command; the command's own shell is stopped by the test (by pid).
    (SIGINT's 130 comes with Ctrl-C's detach and is tested with it.)"""
    sig, code = signal.SIGTERM, 143
    started, pid_file = tmp_path / "started", tmp_path / "job.pid"
    cmd = f"echo $$ > {pid_file}; touch {started}; exec sleep 60"
    proc = subprocess.Popen(
        [*ENTRY, "sop", "run", "exec", "--local", "--set", f"cmd={cmd}"],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "TPUOPS_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), proc.communicate(timeout=30)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == code, err
        assert b"Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid_file.exists():
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)  # the job leads its own session
            except ProcessLookupError:
                pass
