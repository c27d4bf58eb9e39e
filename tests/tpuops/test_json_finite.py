"""NaN and inf never make invalid JSON: --json, result.json, report --json write null; HTML plots skip them."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tests.tpuops.test_usage_errors import tpuops
from tpuops.run import htmlpage
from tpuops.run.scan import scan_file

LINES = [
    "step=0 reward_mean=nan reward_delta=+0.0000 entropy=1.0000 dt=1.00s grad_norm=inf loss=0.500000",
    "step=1 reward_mean=0.5000 reward_delta=+0.5000 entropy=1.0000 dt=1.00s grad_norm=1.0 loss=inf",
    "step=2 reward_mean=0.6000 reward_delta=+0.1000 entropy=1.0000 dt=1.00s grad_norm=1.0 loss=-inf",
    'metrics: {"kind": "gradcheck", "max_abs": NaN, "ratio": Infinity, "ok": 1.5}',
    'summary: {"steps": 3, "reward_mean_first": NaN, "dt_p50": 1.0}',
]


def strict(text: str) -> Any:
    """JSON as JSON.parse reads it: NaN, Infinity and -Infinity are errors."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


def test_report_json_writes_null_for_non_finite_numbers(tmp_path: Path) -> None:
    log = tmp_path / "nan.log"
    log.write_text("\n".join(LINES) + "\n")
    r = tpuops("report", str(log), "--json", cwd=tmp_path)
    data = strict(r.stdout)["report"]
    rows = {row["step"]: row for row in data["rows"]}
    assert rows[0]["reward_mean"] is None and rows[1]["loss"] is None and rows[2]["loss"] is None
    assert rows[0]["loss"] == 0.5  # finite values stay
    assert data["metrics"][0]["max_abs"] is None and data["metrics"][0]["ok"] == 1.5
    assert data["summary"]["reward_mean_first"] is None


def test_a_run_json_and_its_result_json_are_valid(tmp_path: Path) -> None:
    """A SOP scanning its stdout (as gradcheck does), run locally with --json; then its saved result.json."""
    printed = " ".join(f"'{line}'" for line in LINES).replace('"', '\\"')
    (tmp_path / "nanjob.yaml").write_text(
        "name: nanjob\ndescription: step lines with non-finite values\nscan: {source: stdout, warmup: 0}\n"
        f"steps:\n  - kind: shell\n    command: \"printf '%s\\\\n' {printed}\"\n    output: true\n"
    )
    r = tpuops("sop", "run", str(tmp_path / "nanjob.yaml"), "--local", "--json", cwd=tmp_path)
    data = strict(r.stdout)
    assert r.returncode == 0, r.stderr
    rows = {row["step"]: row for row in data["log"]["rows"]}
    assert rows[1]["loss"] is None and rows[0]["reward_mean"] is None, rows
    (result,) = (Path(os.environ["TPUOPS_HOME"]) / "runs").glob("*/result.json")
    saved = strict(result.read_text())
    assert {row["step"]: row for row in saved["log"]["rows"]}[1]["loss"] is None


def test_html_plots_skip_non_finite_points_and_say_so(tmp_path: Path) -> None:
    log = tmp_path / "nan.log"
    log.write_text("\n".join(LINES) + "\n")
    page = htmlpage.page(scan_file(log, warmup=0))
    assert (
        "grad_norm (1 non-finite value (nan/inf) not drawn)" in page
    )  # loss is not plotted (about 0 in GRPO)
    assert "to the task's max reward 1) (1 non-finite value (nan/inf) not drawn)" in page
    coordinates = re.findall(r'(?:\bd|points|cx|cy|x1|y1|x2|y2|x|y)="([^"]*)"', page)
    assert coordinates and not any(re.search(r"nan|inf", c) for c in coordinates)
