"""`tpuops report`: exit codes, --json, --baseline, and the --html page as headless Chromium draws it."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tests.tpuops.run.test_scan import NEW_MISS, compiling, step_line
from tpuops.run import logreport
from tpuops.run.scan import LogScanner, scan_file

REPO = Path(__file__).resolve().parents[3]


def tpuops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160"},
    )


def write_log(path: Path, dts: list[float], extra: dict[int, list[str]] | None = None) -> Path:
    lines = ["start: backend=cpu process_count=1 process_index=0", "wandb: url=https://wandb.ai/me/p/runs/r1"]
    for i, dt in enumerate(dts):
        lines += (extra or {}).get(i, [])
        lines.append(step_line(i, dt, reward=0.1 * i, loss=1.0 / (i + 1)))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def clean_log(tmp_path: Path) -> Path:
    return write_log(tmp_path / "clean.log", [9.0, 1.0, 1.1, 0.9, 1.0, 1.2], {0: [compiling("train_step")]})


def test_the_text_report_says_how_the_mean_reward_moved(clean_log: Path, tmp_path: Path) -> None:
    r = tpuops("report", str(clean_log), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "reward_mean 0.0000 at step 0 -> 0.5000 at step 5 (+0.5000)" in r.stderr


def test_clean_log_exits_0_with_a_json_report(clean_log: Path, tmp_path: Path) -> None:
    r = tpuops("report", str(clean_log), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["ok"] is True and data["exit_code"] == 0 and data["baseline"] is None
    rep = data["report"]
    assert rep["steps"] == 6 and rep["dt"]["n"] == 5 and rep["dt"]["p50"] == 1.0
    assert rep["wandb_url"] == "https://wandb.ai/me/p/runs/r1" and rep["compiles"]["warmup"] == 1


def test_people_output_goes_to_stderr(clean_log: Path, tmp_path: Path) -> None:
    r = tpuops("report", str(clean_log), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == ""
    assert "steady dt over 5 steps: mean 1.040s  p50 1.000s  p90 1.160s" in r.stderr
    assert "ok (exit code 0)" in r.stderr


def test_recompile_after_warmup_exits_7_and_names_the_function(tmp_path: Path) -> None:
    log = write_log(
        tmp_path / "r.log",
        [5.0, 1.0, 1.0, 1.0],
        {0: [compiling("a")], 2: [*NEW_MISS, compiling("train_step")]},
    )
    r = tpuops("report", str(log), cwd=tmp_path)
    assert r.returncode == 7, r.stderr
    assert (
        "recompile at step 2 (w0): train_step" in r.stderr
        and "now i32[16,40] and before i32[16,32]" in r.stderr
    )
    assert tpuops("report", str(log), "--warmup", "3", cwd=tmp_path).returncode == 0


def test_failure_signature_exits_1_even_with_recompiles(tmp_path: Path) -> None:
    log = write_log(
        tmp_path / "f.log", [5.0, 1.0], {1: [compiling("x"), "Out of memory while trying to allocate 8GiB"]}
    )
    r = tpuops("report", str(log), "--json", cwd=tmp_path)
    assert r.returncode == 1
    assert [f["kind"] for f in json.loads(r.stdout)["report"]["failures"]] == ["oom"]


def test_a_run_id_is_read_from_the_state_home_with_exit_files(tpuops_home: Path, tmp_path: Path) -> None:
    run = tpuops_home / "runs" / "grpo-1"
    run.mkdir(parents=True)
    write_log(run / "worker-0.log", [3.0, 1.0, 1.0])
    (run / "worker-1.log").write_text("start: backend=cpu process_count=1 process_index=1\n")
    (run / "worker-0.exit").write_text("0\n")
    r = tpuops("report", "grpo-1", "--json", cwd=tmp_path)
    assert r.returncode == 1
    rep = json.loads(r.stdout)["report"]
    assert rep["workers"] == [0, 1] and rep["exit_codes"] == {"0": 0, "1": None}
    assert sorted(f["kind"] for f in rep["failures"]) == ["multihost", "no_exit_file"]
    missing = tpuops("report", "no-such-run", cwd=tmp_path)
    assert missing.returncode == 2 and "neither a log file nor a run" in missing.stderr


def test_baseline_regression_beyond_the_threshold_exits_1(clean_log: Path, tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    base.write_text(tpuops("report", str(clean_log), "--json", cwd=tmp_path).stdout)
    same = tpuops("report", str(clean_log), "--baseline", str(base), "--json", cwd=tmp_path)
    assert same.returncode == 0 and all(d["change"] == 0 for d in json.loads(same.stdout)["baseline"])
    slower = write_log(tmp_path / "slow.log", [9.0, 1.2, 1.3, 1.1, 1.2, 1.4])  # +19% mean dt
    r = tpuops("report", str(slower), "--baseline", str(base), "--json", cwd=tmp_path)
    assert r.returncode == 1
    deltas = {d["metric"]: d for d in json.loads(r.stdout)["baseline"]}
    assert deltas["dt.mean"]["regressed"] and deltas["dt.mean"]["change"] == pytest.approx(1.24 / 1.04 - 1)
    loose = tpuops("report", str(slower), "--baseline", str(base), "--threshold", "0.5", cwd=tmp_path)
    assert loose.returncode == 0 and "against the baseline" in loose.stderr


def test_tokens_per_second_is_a_higher_is_better_metric(clean_log: Path) -> None:
    report = scan_file(clean_log)
    faster = {"report": {**report.to_dict(), "tokens_per_s_mean": report.tokens_per_s_mean / 2}}
    (d,) = [d for d in logreport.compare(report, faster) if d.metric == "tokens_per_s_mean"]
    assert d.change == pytest.approx(-1.0) and not d.regressed


def test_html_page_is_self_contained_escaped_and_has_three_plots(tmp_path: Path) -> None:
    s = LogScanner()
    for i in range(30):
        s.feed(step_line(i, 1.0 + (i % 5) / 10, reward=i / 30))
    s.feed("Traceback (most recent call last):")
    s.feed('  File "x.py", line 1, in <module>')
    s.feed("ValueError: <script>alert(1)</script>")
    page = logreport.page(s.close())
    assert re.findall(r'<svg class="plot" id="([^"]+)"', page) == ["plot-dt", "plot-reward", "plot-loss"]
    assert page.count("<polyline") == 5  # dt, rollout_generate, update, reward, loss
    assert "<script" not in page and "&lt;script&gt;" in page
    assert not re.search(r"(?:src|href)\s*=|@import|url\(", page)  # nothing is fetched


def test_html_says_what_was_not_measured_and_draws_a_flat_series_on_a_readable_axis() -> None:
    """Compile logging off: the Compiles table says "not logged", not 0s; an all-zero loss is drawn on 0..1."""
    s = LogScanner()
    for i in range(6):
        s.feed(step_line(i, 1.0, reward=i / 6, loss=0.0))
    page = logreport.page(s.close())
    compiles = page.split("<h2>Compiles</h2>", 1)[1].split("</table>", 1)[0]
    assert compiles.count("not logged") == 5 and "<td>0</td>" not in compiles
    loss = re.search(r'<svg class="plot" id="plot-loss".*?</svg>', page).group(0)
    ticks = re.findall(r'text-anchor="end">([^<]+)</text>', loss)
    assert ticks == ["0", "0.25", "0.5", "0.75", "1"], ticks  # not 0 .. 1e-09
    logged = LogScanner()
    logged.feed(compiling("step"))
    for i in range(3):
        logged.feed(step_line(i, 1.0))
    assert "not logged" not in logreport.page(logged.close())


def test_svg_plot_breaks_lines_at_missing_values() -> None:
    svg = logreport.svg_plot("p", "t", [0, 1, 2, 3, 4], [("a", [1.0, 2.0, None, 3.0, None])], [2])
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 1 and svg.count('class="mark"') == 1
    assert "no data" in logreport.svg_plot("p", "t", [0], [("a", [None])], [])


# ---- the page in a real browser ----
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def chromium() -> str:
    """Debian's chromium. Installed by scripts/test.sh, never from inside pytest (a test installs nothing)."""
    found = shutil.which("chromium")
    if not found:
        pytest.fail("Debian's chromium is required (bash scripts/test.sh installs it with apt-get)")
    return found


def png_pixels(data: bytes) -> tuple[int, int, set[tuple[int, int, int]]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes): width, height, distinct colours."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), w * bpp
    prev, colours = bytearray(stride), set()
    for y in range(h):
        f, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = row[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                row[i] = (row[i] + a) & 255
            elif f == 2:
                row[i] = (row[i] + b) & 255
            elif f == 3:
                row[i] = (row[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update(zip(row[0::bpp], row[1::bpp], row[2::bpp], strict=True))
        prev = row
    return w, h, colours


@pytest.mark.slow
def test_html_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    exe = chromium()
    log = write_log(
        tmp_path / "run.log",
        [6.0 - min(i, 5) + (i % 3) * 0.3 for i in range(40)],
        {7: [compiling("train_step")]},
    )
    page = tmp_path / "report.html"
    r = tpuops("report", str(log), "--html", str(page), cwd=tmp_path)
    assert r.returncode == 7 and page.is_file()
    shot = tmp_path / "shot.png"
    args = [
        exe,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=800,1100",
        page.as_uri(),
    ]
    subprocess.run(args, capture_output=True, timeout=90, check=True, cwd=tmp_path)
    data = shot.read_bytes()
    assert len(data) > 20_000
    w, h, colours = png_pixels(data)
    assert (w, h) == (800, 1100) and len(colours) > 20
    # The series colours are drawn (legend squares are solid): the plots rendered, not just text.
    assert {(31, 119, 180), (214, 39, 40), (44, 160, 44)} <= colours
    dom = subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    ).stdout
    assert dom.count("<svg") == 3 and "recompile at step 7 (w0): train_step" in dom
