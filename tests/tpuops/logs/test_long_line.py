"""A log holding one 120 MB line, end to end through the installed CLI: the run that follows and fetches it, and
`tpuops logs` of its local copy and of the worker's file, each stay under 100 MB of memory (peak RSS of the
process, as the kernel counts it) and show the line in pieces of at most LINE_LIMIT characters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuops.logs.chunks import LINE_LIMIT

pytestmark = pytest.mark.slow

LINE = 120_000_000  # characters of the one long line
PEAK = 100_000_000  # bytes of memory any of the three may hold at most


# Started by a small Python of its own: a child's peak RSS counts its parent's at the fork (Linux keeps the larger
# across exec), and this test's process may be large; this one is a few MB. Prints the exit code and the peak.
_MEASURE = """import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(p.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024, file=sys.stderr)
"""


def _peak(args: list[str], cwd: Path, out: Path, err: Path) -> tuple[int, int]:
    """Run tpuops to completion with stdout/stderr in files; (exit code, its peak RSS in bytes)."""
    argv = [sys.executable, "-c", _MEASURE, sys.executable, "-m", "tpuops", *args]
    with out.open("wb") as o, err.open("wb") as e:
        subprocess.run(argv, stdout=o, stderr=e, cwd=cwd, check=True, timeout=300)
    with err.open("rb") as f:
        f.seek(max(0, err.stat().st_size - 200))
        code, peak = f.read().splitlines()[-1].split()
    return int(code), int(peak)


def _pieces(path: Path) -> list[int]:
    """The length of each output line longer than 1,000 characters (the long line's pieces), read a line at a
    time in binary, so the test holds no more than a piece."""
    with path.open("rb") as f:
        return [n for line in f if (n := len(line.rstrip(b"\n"))) > 1000]


def test_a_120_mb_line_is_followed_fetched_and_shown_in_pieces_in_bounded_memory(tmp_path: Path) -> None:
    sop = tmp_path / "long.yaml"
    job = f"echo step=0; head -c {LINE} /dev/zero | tr '\\0' x; echo; echo step=1"
    sop.write_text(json.dumps({
        "name": "long",
        "steps": [
            {"kind": "run", "command": job, "runs_dir": "~/runs"},
            {"kind": "follow", "runs_dir": "~/runs", "poll_s": 0.05, "timeout": 120},
            {"kind": "fetch_log", "runs_dir": "~/runs"},
        ],
    }))  # fmt: skip
    code, peak = _peak(
        ["sop", "run", str(sop), "--local"], tmp_path, tmp_path / "run.out", tmp_path / "run.err"
    )
    assert code == 0, (tmp_path / "run.err").read_bytes()[-2000:]
    assert peak < PEAK, f"the run peaked at {peak / 1e6:.0f} MB"
    # The follow showed the line live (stderr, after `[w0] `) in pieces.
    shown = _pieces(tmp_path / "run.err")
    assert sum(shown) - len(shown) * len("[w0] ") == LINE and max(shown) == LINE_LIMIT + len("[w0] "), shown[
        -3:
    ]

    (run_id,) = [p.name for p in (Path(os.environ["TPUOPS_HOME"]) / "runs").iterdir()]
    copy = Path(os.environ["TPUOPS_HOME"]) / "runs" / run_id / "worker-0.log"
    assert copy.stat().st_size == LINE + len("step=0\n\nstep=1\n")  # the fetched copy holds the line whole
    for where in ("local copy", "worker's file"):
        if where == "worker's file":
            copy.unlink()  # `tpuops logs` now reads the worker's log over the transport
        out = tmp_path / f"logs-{where[0]}.out"
        code, peak = _peak(["logs", run_id], tmp_path, out, tmp_path / "logs.err")
        assert code == 0, (tmp_path / "logs.err").read_text()[-2000:]
        assert peak < PEAK, f"`tpuops logs` of the {where} peaked at {peak / 1e6:.0f} MB"
        pieces = _pieces(out)
        assert len(pieces) == -(-LINE // LINE_LIMIT) and sum(pieces) == LINE, (
            where
        )  # 115 pieces, nothing lost
        assert max(pieces) == LINE_LIMIT, where
        with out.open("rb") as f:
            assert f.readline() == b"step=0\n", where
            f.seek(-len(b"step=1\n"), os.SEEK_END)
            assert f.read() == b"step=1\n", where
