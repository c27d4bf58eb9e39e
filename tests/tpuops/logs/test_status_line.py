"""The live view's status line: a spinner that turns, one numbering for rows and the line, the elapsed time and
ETA never pushed off it, the total/ETA/elapsed kept after `attach`, and numbers rounded for people."""

from __future__ import annotations

import time

from rich.console import Console

from tpuops import console
from tpuops.logs.progress import Progress, fit_line

STEP = (
    "step={i} reward_mean=0.{i} entropy=1.2000 dt={dt:.2f}s kl_old=0.0001 grad_norm=0.5 tokens_per_s=1500.0"
)
CONFIG = "config: task=arith steps=20 max_reward=1 file=/runs/x/config.json"


def _frame(spinner: object, at: float) -> str:
    """What the spinner draws at time `at` (rich's Live calls render with the time of each redraw)."""
    c = Console(width=120, color_system=None)
    with c.capture() as got:
        c.print(spinner.render(at))  # type: ignore[attr-defined]
    return got.get()


def test_the_spinner_turns_between_redraws() -> None:
    p = Progress()
    p.phase(0, "follow", "follow", "begin")
    live = console.Live(p)
    first = live._status()
    again = live._status()
    assert again is first  # one spinner whose text is renewed: a new one would restart at its first frame
    start = time.time()
    glyphs = {_frame(first, start + k * 0.08)[0] for k in range(10)}  # 0.8 s of redraws at 80 ms a frame
    assert len(glyphs) >= 5, glyphs


def test_rows_and_status_line_count_steps_alike() -> None:
    p = Progress()
    p.phase(0, "follow", "follow", "begin")
    p.line(0, CONFIG)
    for i in range(20):
        shown = p.line(0, STEP.format(i=i, dt=0.5))
    assert shown.split()[0] == "20/20"  # the log's step=19: the 20th of 20
    assert " · step 20/20 · " in p.status()


def test_a_long_phase_is_cut_and_the_elapsed_time_stays() -> None:
    t0 = time.monotonic()
    p = Progress(started=t0)
    for w in (0, 1):
        p.phase(w, "python_env", "python_env", "doing collecting " + "nvidia-cublas-cu12==12.4.5.8 " * 6)
    line = p.status(now=t0 + 75, width=120)
    assert len(line) <= 120 and line.endswith("· elapsed 01:15") and "…" in line
    assert p.status(now=t0 + 75).startswith("preparing venv: collecting nvidia")  # no width: whole


def test_fit_line_drops_rate_and_reward_before_step_elapsed_or_eta() -> None:
    parts = ["stepping (w0-w15) on a very long phase", "step 8/20", "elapsed 00:20", "0.50 s/step", "ETA 00:06",
             "reward 0.00 → 0.70 ↑"]  # fmt: skip
    assert fit_line(parts, 200) == " · ".join(parts)
    narrow = fit_line(parts, 60)
    assert len(narrow) <= 60 and all(k in narrow for k in ("step 8/20", "elapsed 00:20", "ETA 00:06"))
    assert "reward" not in narrow
    tiny = fit_line(parts, 40)  # too narrow for everything: the kept parts stay whole, the phase shortest
    assert tiny.endswith("step 8/20 · elapsed 00:20 · ETA 00:06") and tiny.startswith("stepping (w")


def test_after_attach_the_total_eta_and_elapsed_since_the_start_are_kept() -> None:
    p = Progress.following(started_at=time.time() - 125)
    for text in [CONFIG, *(STEP.format(i=i, dt=0.5) for i in range(8))]:
        p.past(0, text)  # shown by the run's own follow: counted, not printed again
    p.past(1, "config: task=arith steps=99")  # another worker's lines do not count
    rows = p.line(0, STEP.format(i=8, dt=0.5)).split("\n")
    assert rows[0].split()[0] == "step" and rows[1].split()[0] == "9/20"  # the header again, then the row
    status = p.status()
    assert "step 9/20" in status and "ETA 00:05" in status and "0.50 s/step" in status
    assert "elapsed 02:0" in status  # from the run's start, not from the attach


def test_the_summary_line_shows_numbers_rounded_for_people() -> None:
    p = Progress()
    shown = p.line(
        0, 'summary: {"steps":20,"dt_p50":0.21500000000000002,"loss_last":-1.25e-05,"params":{"a":1}}'
    )
    assert shown == "summary: steps=20 dt_p50=0.215 loss_last=-1.25e-05"
    assert p.line(0, "summary: not json") == "summary: not json"
