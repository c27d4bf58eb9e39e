"""`tpuops report`: exit codes, --json, --baseline, and the --html page as headless Chromium draws it."""

from __future__ import annotations

import html
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
from tpuops.run import htmlpage, logreport
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


def full_step_line(i: int, dt: float, reward: float) -> str:
    """A step line with every learning signal, in the trainer's order (docs/contracts.md)."""
    return (
        f"step={i} reward_mean={reward:.4f} reward_delta=+0.0100 entropy={2.0 - i / 40:.4f} dt={dt:.2f}s "
        f"kl_old={0.001 * (i % 4):.6f} clip_frac={0.02 * (i % 3):.4f} grad_norm={1 + (i % 5) / 10:.4f} "
        f"tokens_per_s={1500 + 10 * i:.1f} rollout_generate={dt * 0.6:.2f}s update={dt * 0.3:.2f}s loss=0.000000"
    )


def _value(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:  # data-yscale="log"
        return text


def figures(page: str) -> dict[str, dict[str, object]]:
    """Each chart of a page as drawn: its data attributes, y and x tick labels, and the points of each line."""
    found: dict[str, dict[str, object]] = {}
    for m in re.finditer(r'<figure class="chart" id="chart-([^"]+)"([^>]*)>(.*?)</figure>', page, re.S):
        attrs = {k: _value(html.unescape(v)) for k, v in re.findall(r"data-(\w+)='([^']*)'", m[2])}
        attrs.update({k: _value(html.unescape(v)) for k, v in re.findall(r'data-(\w+)="([^"]*)"', m[2])})
        body = m[3]

        def ticks(axis: str, body: str = body) -> list[str]:
            return re.findall(rf'id="[\w-]*{axis}tick_\d+">.*?<text[^>]*>([^<]*)</text>', body, re.S)

        lines = {
            name: len(re.findall(r"[ML] -?[\d.]+ -?[\d.]+", path))
            for name, path in re.findall(r'<g id="series-([^"]+)">\s*<path d="([^"]*)"', body)
        }
        found[m[1]] = {**attrs, "yticks": ticks("y"), "xticks": ticks("x"), "lines": lines, "body": body}
    return found


def realistic_report(recompile_at: int | None = None, steps: int = 40):
    s = LogScanner()
    s.feed("config: task=arith model=tiny steps=40 max_reward=1 file=/runs/r/config.json")
    s.feed(compiling("train_step"))
    for i in range(steps):
        if recompile_at == i:
            s.feed(compiling("train_step"))
        s.feed(full_step_line(i, 11.0 if i == 0 else 0.13 + (i % 3) * 0.01, reward=min(0.9, 0.05 * i)))
    return s.close()


def test_html_page_is_self_contained_and_escaped() -> None:
    s = LogScanner()
    for i in range(30):
        s.feed(step_line(i, 1.0 + (i % 5) / 10, reward=i / 30))
    s.feed("Traceback (most recent call last):")
    s.feed('  File "x.py", line 1, in <module>')
    s.feed("ValueError: <script>alert(1)</script>")
    page = htmlpage.page(s.close())
    # The log's own fields only: no grad_norm, kl_old or clip_frac panel for a line without them; its other
    # fields (the steps table's first few) get a chart each.
    assert list(figures(page)) == [
        "dt",
        "reward",
        "entropy",
        "tokens_per_s",
        "completion_len_mean",
        "completion_len_max",
    ]
    assert "<script" not in page and "&lt;script&gt;" in page
    assert not re.search(r"""(?:src|href)\s*=\s*["'](?!#)|@import|url\((?!#)""", page)  # nothing is fetched
    assert "<metadata>" not in page


def test_charts_show_bounded_quantities_on_their_range_and_step_time_on_a_log_axis() -> None:
    charts = figures(htmlpage.page(realistic_report()))
    dt = charts["dt"]
    assert dt["yscale"] == "log" and dt["series"] == ["dt", "rollout_generate", "update"]
    lo, hi = dt["ylim"]
    assert 0.14 < hi < 1.0 and lo < 0.13 * 0.3  # step 0's 11 s (the compile) is out of the scale...
    assert "11 ↑" in dt["body"]  # ...and said
    assert dt["legend"] == ["dt", "rollout_generate", "update", "warm-up (1 step)"]  # no recompile
    assert dt["lines"] == {"dt": 40, "rollout_generate": 40, "update": 40}
    assert all(re.fullmatch(r"0\.\d|[1-9]|0\.0\d", t) for t in dt["yticks"]), dt["yticks"]  # 0.05, 0.1, 0.2
    reward = charts["reward"]
    assert reward["ylim"] == [0.0, 1.0] and reward["lines"] == {"reward_mean": 40}  # 0.9 is not the top edge
    assert reward["yticks"] == ["0", "0.2", "0.4", "0.6", "0.8", "1"]
    assert charts["clip_frac"]["ylim"] == [0.0, 1.0] and charts["entropy"]["ylim"][0] == 0.0
    assert charts["kl_old"]["lines"] == {"kl_old": 40} and charts["grad_norm"]["lines"] == {"grad_norm": 40}
    assert charts["tokens_per_s"]["series"] == ["tokens/s"] and charts["compiles"]["series"] == ["compiles"]
    xt = [int(t) for t in reward["xticks"]]
    assert xt == list(range(xt[0], xt[-1] + 1, xt[1] - xt[0])) and xt[1] - xt[0] in (
        1,
        2,
        5,
        10,
    )  # even steps
    marked = figures(htmlpage.page(realistic_report(recompile_at=20)))["dt"]
    assert marked["legend"][-1] == "recompile" and 'id="recompile-20"' in marked["body"]


def test_html_says_what_was_not_measured_and_draws_no_empty_series() -> None:
    """Compile logging off: the Compiles table says "not logged", not 0s, and no compiles chart is drawn; a
    log without grad_norm gets no grad_norm panel at all (nor kl_old, clip_frac), not an empty axis."""
    s = LogScanner()
    for i in range(6):
        s.feed(step_line(i, 1.0, reward=i / 6, loss=0.0))
    page = htmlpage.page(s.close())
    compiles = page.split("<h2>Compiles</h2>", 1)[1].split("</table>", 1)[0]
    assert compiles.count("not logged") == 5 and ">0<" not in compiles
    charts = figures(page)
    assert "compiles" not in charts and not {"grad_norm", "kl_old", "clip_frac"} & set(charts)
    assert "no data" not in page
    logged = LogScanner()
    logged.feed(compiling("step"))
    for i in range(3):
        logged.feed(step_line(i, 1.0))
    assert "not logged" not in htmlpage.page(logged.close())


def test_the_page_starts_with_the_runs_metadata_and_shows_numbers_readably(tpuops_home: Path) -> None:
    run = tpuops_home / "runs" / "20261126-1200-grpo-ab12"
    run.mkdir(parents=True)
    record = {"run_id": run.name, "sop": "grpo", "target": {"vm": "mllm-jax-v6e-8"}, "workers": [0, 1],
              "values": {"config": "arith", "branch": "430589e4", "trainer_sets": ["--set=train.steps=40"]},
              "started": 1_795_000_000.0, "argv": ["tpuops", "run", "grpo", "--vm", "mllm-jax-v6e-8"]}  # fmt: skip
    (run / "run.json").write_text(json.dumps(record))
    (run / "result.json").write_text(json.dumps({"ok": True, "exit_code": 0, "finished": 1_795_000_071.4}))
    meta = htmlpage.run_meta(run.name)
    assert meta is not None and meta["SOP"] == "grpo" and meta["commit"] == "430589e4"
    assert meta["duration"] == "71 s" and meta["command"] == "tpuops run grpo --vm mllm-jax-v6e-8"
    assert meta["config"] == "arith --set=train.steps=40" and meta["target"].startswith("mllm-jax-v6e-8")
    report = realistic_report()
    report.summary = {"steps": 40, "dt_p50": 0.13999999999999999, "rollout_generate_mean": 0.6851234567}
    page = htmlpage.page(report, None, meta)
    head = page.split("<h2>", 1)[0]
    assert all(
        f"<td>{k}</td>" in head for k in ("SOP", "config", "commit", "target", "start", "duration", "command")
    )
    summary = page.split("<h2>Summary", 1)[1].split("</table>", 1)[0]
    assert ">0.14<" in summary and ">0.6851<" in summary and "0.13999" not in summary
    assert htmlpage.run_meta(str(run / "worker-0.log")) is None  # a bare log file has no record


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
    """The page as Chromium draws it (a screenshot: the series' colours are there) and as Chromium reads it
    (its DOM: the axes' ranges, the tick labels and the points of every plotted series)."""
    exe = chromium()
    log = tmp_path / "run.log"
    lines = ["config: task=arith model=tiny steps=40 max_reward=1", compiling("train_step")]
    for i in range(40):
        lines += [compiling("train_step")] if i == 7 else []
        lines.append(full_step_line(i, 6.0 if i == 0 else 0.4 + (i % 3) * 0.05, reward=min(0.9, 0.03 * i)))
    log.write_text("\n".join(lines) + "\n")
    page = tmp_path / "report.html"
    r = tpuops("report", str(log), "--html", str(page), cwd=tmp_path)
    assert r.returncode == 7 and page.is_file(), r.stderr
    shot = tmp_path / "shot.png"
    args = [
        exe,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=1000,1400",
        page.as_uri(),
    ]
    subprocess.run(args, capture_output=True, timeout=90, check=True, cwd=tmp_path)
    data = shot.read_bytes()
    w, h, colours = png_pixels(data)
    assert (w, h) == (1000, 1400) and len(colours) > 20
    # The series colours are drawn: the charts rendered, not just text.
    assert {(31, 119, 180), (214, 39, 40), (44, 160, 44)} <= colours
    dom = subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    ).stdout
    charts = figures(dom)
    assert set(charts) >= {
        "dt",
        "reward",
        "entropy",
        "grad_norm",
        "kl_old",
        "clip_frac",
        "tokens_per_s",
        "compiles",
    }
    assert charts["reward"]["ylim"] == [0.0, 1.0] and charts["reward"]["yticks"][-1] == "1"
    assert (
        charts["dt"]["yscale"] == "log" and charts["dt"]["ylim"][1] < 6.0
    )  # the warm-up is out of the scale
    assert charts["dt"]["legend"][-1] == "recompile"
    for name in ("dt", "reward", "entropy", "grad_norm", "kl_old", "clip_frac", "tokens_per_s"):
        assert all(n == 40 for n in charts[name]["lines"].values()) and charts[name]["lines"], name
    assert "recompile at step 7 (w0): train_step" in dom and "<script" not in dom


def test_json_rows_carry_the_learning_signals(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("\n".join(full_step_line(i, 1.0, reward=0.1 * i) for i in range(3)) + "\n")
    r = tpuops("report", str(log), "--json", cwd=tmp_path)
    rows = json.loads(r.stdout)["report"]["rows"]
    assert r.returncode == 0 and [row["step"] for row in rows] == [0, 1, 2]
    assert rows[2]["entropy"] == 1.95 and rows[2]["grad_norm"] == 1.2 and rows[2]["kl_old"] == 0.002
    assert (
        rows[2]["clip_frac"] == 0.04 and rows[2]["reward_delta"] == 0.01 and rows[2]["tokens_per_s"] == 1520.0
    )
