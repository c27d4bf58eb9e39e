"""A user's run in its own terms: a log of `step=N loss=... time=...` lines gets a steps table, live rows and an
HTML page (as headless Chromium reads it) of loss and step time, with no column or panel of the bundled trainer's
GRPO fields; `--columns` / `--set columns=` choose the fields shown."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.tpuops.run.test_logreport import CHROMIUM_FLAGS, chromium, figures, full_step_line, tpuops
from tpuops.errors import UsageError
from tpuops.logs.progress import Progress
from tpuops.run import htmlpage, scan
from tpuops.run.scan import LogScanner

TRAINER_ONLY = ("rollout_generate", "update", "reward_mean", "tokens/s", "tokens_per_s", "entropy", "kl_old")


def user_log(path: Path, steps: int = 12) -> Path:
    lines = ["loading data...", "model ready"]
    lines += [f"step={i} loss={1.0 / 2 ** min(i, 3):.4f} time={0.5 if i == 0 else 0.11:.2f} acc={i / 20:.2f}"
              for i in range(steps)]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_steps_table_has_the_logs_fields_and_no_empty_trainer_columns(tmp_path: Path) -> None:
    log = user_log(tmp_path / "train.log")
    r = tpuops("report", str(log), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stderr.splitlines() if "step" in line and "loss" in line)
    assert header.split("┃")[1:-1] and [c.strip() for c in header.split("┃")[1:-1]] == [
        "step",
        "loss",
        "dt",
        "acc",
    ]
    assert not any(name in r.stderr for name in TRAINER_ONLY)
    assert "loss 1 at step 0 -> 0.125 at step 11" in r.stderr
    data = json.loads(tpuops("report", str(log), "--json", cwd=tmp_path).stdout)["report"]
    assert data["fields"] == ["loss", "dt", "acc"] and data["rows"][11]["loss"] == 0.125
    assert data["rows"][11]["extra"] == {"acc": 0.55} and data["dt"]["p50"] == 0.11
    chosen = tpuops("report", str(log), "--columns", "acc,loss", cwd=tmp_path)
    header = next(line for line in chosen.stderr.splitlines() if "step" in line and "acc" in line)
    assert [c.strip() for c in header.split("┃")[1:-1]] == ["step", "acc", "loss"]
    wrong = tpuops("report", str(log), "--columns", "loss,reward_mean", cwd=tmp_path)
    assert wrong.returncode == 2 and "column 'reward_mean' is not a field" in wrong.stderr
    assert "(they have: loss, dt, acc)" in wrong.stderr


def test_the_live_rows_show_the_logs_fields_or_the_chosen_ones() -> None:
    p = Progress()
    shown = [p.line(0, f"step={i} loss={1.0 / (i + 1):.4f} time=0.11 acc=0.{i}") for i in range(3)]
    head = shown[0].splitlines()[0].split()
    assert head == ["step", "loss", "dt", "acc"] and "reward" not in shown[0]
    assert shown[2].split() == ["2", "0.3333", "0.11s", "0.2"]
    chosen = Progress(columns=["acc"])
    assert chosen.line(0, "step=0 loss=1 acc=0.5").splitlines()[0].split() == ["step", "acc"]
    grpo = Progress()  # the bundled trainer's line: its learning signals first, as before
    head = grpo.line(0, full_step_line(0, 1.0, reward=0.1)).splitlines()[0].split()
    assert head == ["step", "reward", "Δ", "entropy", "dt", "kl_old", "clip", "grad", "tok/s"]


def test_the_page_charts_the_users_loss_and_none_of_grpos_panels() -> None:
    s = LogScanner()
    for i in range(12):
        s.feed(f"step={i} loss={1.0 / 2 ** min(i, 3):.4f} time=0.11 acc={i / 20:.2f}")
    page = htmlpage.page(s.close())
    charts = figures(page)
    assert list(charts) == ["dt", "loss", "acc"]
    assert charts["loss"]["lines"] == {"loss": 12} and charts["acc"]["lines"] == {"acc": 12}
    assert "in GRPO" not in page and "max reward" not in page and "no data" not in page
    grpo = LogScanner()
    for i in range(4):
        grpo.feed(full_step_line(i, 1.0, reward=0.1))
    page = htmlpage.page(grpo.close())
    assert (
        "loss" not in figures(page) and "in GRPO it is about 0" in page
    )  # GRPO's note, where GRPO's fields are


def test_a_runs_columns_are_its_reports_columns(tpuops_home: Path, tmp_path: Path) -> None:
    from tests.tpuops.run.test_own_command import plan

    assert plan(tmp_path, "job", ("python", "t.py"), columns="acc, loss").values["columns"] == ["acc", "loss"]
    with pytest.raises(UsageError, match="columns: 'a b' is not a field name"):
        plan(tmp_path, "job", ("python", "t.py"), columns="a b")
    run = tpuops_home / "runs" / "20261129-job-ab12"
    run.mkdir(parents=True)
    user_log(run / "worker-0.log")
    (run / "worker-0.exit").write_text("0\n")
    (run / "run.json").write_text(  # as a run records itself (its result too: the logs are all here)
        json.dumps(
            {
                "run_id": run.name,
                "sop": "job",
                "values": {"columns": ["acc"]},
                "workers": [0],
                "target": {"local": True},
                "started": 0.0,
            }
        )
    )
    (run / "result.json").write_text(json.dumps({"ok": True, "exit_code": 0}))
    assert scan.scan_run(run).columns == ["acc"]
    r = tpuops("report", run.name, cwd=tmp_path)
    header = next(line for line in r.stderr.splitlines() if "step" in line and "acc" in line)
    assert r.returncode == 0 and [c.strip() for c in header.split("┃")[1:-1]] == ["step", "acc"]


@pytest.mark.slow
def test_the_users_page_in_headless_chromium(tmp_path: Path) -> None:
    exe = chromium()
    log = user_log(tmp_path / "train.log", steps=30)
    page = tmp_path / "report.html"
    r = tpuops("report", str(log), "--html", str(page), cwd=tmp_path)
    assert r.returncode == 0 and page.is_file(), r.stderr
    dom = subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    ).stdout
    charts = figures(dom)
    assert list(charts) == ["dt", "loss", "acc"]
    loss = charts["loss"]
    assert loss["series"] == ["loss"] and loss["lines"] == {"loss": 30} and loss["yscale"] == "linear"
    lo, hi = loss["ylim"]
    assert lo < 0.125 and 1.0 < hi < 1.2  # the user's loss, 1.0 -> 0.125, on its own axis
    assert charts["dt"]["series"] == ["dt"] and charts["dt"]["lines"] == {"dt": 30}
    assert "in GRPO" not in dom and "max reward" not in dom and "no data" not in dom
    at_a_glance = dom.split("<h2>At a glance</h2>", 1)[1].split("</table>", 1)[0]
    assert "1 at step 0 -&gt; 0.125 at step 29" in at_a_glance
    every = dom.split("every plotted step", 1)[1]
    assert "<th>loss</th><th>dt</th><th>acc</th>" in every and "reward_mean" not in every
