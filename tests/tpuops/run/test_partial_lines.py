"""Step lines with some optional fields and not others (any combination of the chip fields): the text report (a
run's end report is the same renderer), `tpuops top` and the HTML page show what is there and never fail."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.tpuops.run.test_logreport import figures, tpuops
from tpuops.console import err
from tpuops.logs.events import CHIP_FIELDS, CHIP_LISTS
from tpuops.run import htmlpage, logreport, report
from tpuops.run.scan import LogScanner
from tpuops.run.top import Top, WorkerTop

VALUES = {
    "hbm_gb_min": "20.10",
    "hbm_gb_max": "22.40",
    "hbm_gb_peak": "23.50",
    "hbm_gb_limit": "33.60",
    "duty_pct_min": "61.0",
    "duty_pct_max": "74.5",
    "hbm_gb_chips": "20.10/22.40",
    "duty_pct_chips": "61.0/74.5",
}
OPTIONAL = (*CHIP_FIELDS, *CHIP_LISTS)
EVERY_SUBSET = [c for n in range(len(OPTIONAL) + 1) for c in itertools.combinations(OPTIONAL, n)]


def lines(fields: tuple[str, ...]) -> list[str]:
    chips = " ".join(f"{k}={VALUES[k]}" for k in fields)
    return [f"step={i} reward_mean=0.{i} dt=1.00s loss=0.0 {chips}".rstrip() for i in range(3)] + [
        f"chips: step=2 process=1 {chips}".rstrip()
    ]


def scanned(fields: tuple[str, ...]) -> logreport.LogReport:
    s = LogScanner()
    for line in lines(fields):
        s.feed(line)
    return s.close()


def test_every_combination_of_chip_fields_renders_in_the_report_and_in_top() -> None:
    assert len(EVERY_SUBSET) == 256
    for fields in EVERY_SUBSET:
        r = scanned(fields)
        with err.capture() as text:
            logreport.render(r, 0, False, None, None)
            latest = r.chips.get(0, [{}])[-1]
            chips = {k: v for k, v in latest.items() if k != "step"} or None
            report.top_table(Top("run-1", (WorkerTop(0, "running", 2, chips),)), as_json=False)
        shown = text.get()
        assert "ok (exit code 0)" in shown, fields
        if "hbm_gb_max" in fields and "hbm_gb_min" not in fields:
            assert "HBM 22.40 GB" in shown and "22.40-" not in shown
        if {"hbm_gb_min", "hbm_gb_max"} <= set(fields):
            assert "HBM 20.10-22.40 GB" in shown and "20.10-22.40" in shown
        if "duty_pct_min" in fields and "duty_pct_max" not in fields:
            assert "duty 61%" in shown


def test_a_partial_line_is_exit_0_in_report_and_its_html_page_charts_what_is_there(tmp_path: Path) -> None:
    log = tmp_path / "partial.log"
    log.write_text("\n".join(lines(("hbm_gb_max", "duty_pct_min"))) + "\n")
    page = tmp_path / "partial.html"
    r = tpuops("report", str(log), "--html", str(page), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "chips w0 at step 2: HBM 22.40 GB, duty 61% over 3 samples" in r.stderr
    charts = figures(page.read_text())
    assert charts["hbm"]["series"] == ["w0 max", "w1 max"] and charts["duty"]["series"] == [
        "w0 min",
        "w1 min",
    ]


@pytest.mark.parametrize("fields", [(f,) for f in OPTIONAL] + [()])
def test_the_html_page_of_any_single_chip_field(fields: tuple[str, ...]) -> None:
    page = htmlpage.page(scanned(fields))
    assert 'id="verdict">ok (exit code 0)' in page
    drawn = figures(page)
    assert ("hbm" in drawn) == bool({"hbm_gb_min", "hbm_gb_max"} & set(fields))
    assert ("duty" in drawn) == bool({"duty_pct_min", "duty_pct_max"} & set(fields))
