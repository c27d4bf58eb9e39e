"""`tpuops run grpo --local --profile-steps A-B`: the bundled trainer traces those steps itself; the end report
and the report page (as headless Chromium reads it) show their top ops and the phase split."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.tpuops.run.test_logreport import CHROMIUM_FLAGS, chromium
from tests.tpuops.test_e2e_local import REPO, tpuops


def section(dom: str) -> str:
    """The page's profile section, as Chromium serialises it."""
    start = dom.index('<section id="profile">')
    return dom[start : dom.index("</section>", start)]


@pytest.mark.slow
def test_profile_steps_of_the_bundled_trainer_in_the_end_report_and_the_page(tmp_path: Path) -> None:
    exe = chromium()
    r = tpuops("run", "grpo", "--local", "--set", "steps=4", "--profile-steps", "2-3", "--json", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(r.stdout)
    w0 = data["profile"]["workers"]["0"]
    assert data["profile"]["steps"] == [2, 3] and w0["steps"] == [2, 3] and not data["profile"]["errors"]
    assert len(w0["ops"]) >= 3 and all(0 < op["share"] <= 1 for op in w0["ops"])
    assert {"rollout", "score", "update", "record"} <= set(w0["phases"])
    assert w0["window_ms"] >= sum(w0["phases"].values()) * 0.99  # the window is those two steps
    run = Path(os.environ["TPUOPS_HOME"]) / "runs" / data["run_id"]
    assert list((run / "profile" / "steps" / "w0").glob("plugins/profile/*/w0.xplane.pb"))
    page = tmp_path / "page.html"
    assert tpuops("report", data["run_id"], "--html", str(page), cwd=tmp_path).returncode == 0
    dom = subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=90, check=True,
    ).stdout  # fmt: skip
    shown = section(dom)
    assert "Profile: steps 2-3" in shown
    phases = shown[shown.index('class="profile-phases"') : shown.index('class="profile-ops"')]
    assert all(f"<td>{p}</td>" in phases for p in ("rollout", "update", "score"))
    ops = shown[shown.index('class="profile-ops"') :]
    assert ops.count("<tr>") - 1 >= 3 and w0["ops"][0]["name"] in ops


CUT_STEPS = """
import sys, time, jax, jax.numpy as jnp
f = jax.jit(lambda x: jnp.sin(x) @ x)
x = jnp.ones((128, 128)); f(x).block_until_ready()
def step(n, between=None):
    with jax.profiler.StepTraceAnnotation("train", step_num=n):
        for i in range(4):
            with jax.profiler.TraceAnnotation(f"phase/p{i}"):
                f(x).block_until_ready(); time.sleep(0.02)
            if between and i == 1:
                between()
step(0, between=lambda: jax.profiler.start_trace(sys.argv[1]))  # a live capture starts mid-step...
step(1)
step(2, between=jax.profiler.stop_trace)  # ... and ends mid-step
"""


@pytest.mark.slow
def test_a_capture_keeps_only_the_steps_it_holds_whole(tmp_path: Path) -> None:
    """Why a short live capture shows phases but no step: JAX keeps an annotation only when it starts and ends
    while the profiler records, so the steps cut by the capture's start and end are not in it at all; the
    summary says so and how to see them."""
    import sys

    from tpuops.logs import trace, xplane
    from tpuops.run.profileview import NO_WHOLE_STEP, summary_lines

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    subprocess.run([sys.executable, "-c", CUT_STEPS, str(tmp_path / "t")], check=True, env=env, timeout=300)
    (found,) = (tmp_path / "t").glob("plugins/profile/*/*.xplane.pb")
    planes = xplane.read(found.read_bytes())
    whole = trace.summarise(planes)
    assert whole.steps == [1] and set(whole.phases) == {"p0", "p1", "p2", "p3"}  # step 0 and 2: not recorded
    # The same capture without step 1 (as a capture shorter than a step would be): phases, no step, and why.
    cut = [p for p in planes if not p.name.startswith("/host:")] + [
        xplane.XPlane(p.name, [xplane.XLine(ln.name, [e for e in ln.events if "step_num" not in e.stats])
                               for ln in p.lines])
        for p in planes if p.name.startswith("/host:")
    ]  # fmt: skip
    lines = summary_lines(trace.summarise(cut))
    assert (
        not trace.summarise(cut).steps
        and NO_WHOLE_STEP in lines
        and any(ln.startswith("phases:") for ln in lines)
    )


@pytest.mark.slow
def test_bench_rollout_profile_gives_each_variant_its_top_ops() -> None:
    r = tpuops("bench", "rollout", "--local", "--set", "steps=4", "--profile", "--variant", "",
               "--variant", "rollout.max_new_tokens=8", "--json", cwd=REPO)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)
    assert [row["label"] for row in rows] == ["baseline", "rollout.max_new_tokens=8"]
    for row in rows:
        assert len(row["top_ops"]) >= 3 and all(0 < op["share"] <= 1 for op in row["top_ops"]), row
        assert row["top_ops"] == sorted(row["top_ops"], key=lambda op: -op["ms"])
        assert {"rollout", "update"} <= set(row["phases"]) and row["profile_note"] is None
        run = Path(os.environ["TPUOPS_HOME"]) / "runs" / row["run_id"]
        assert json.loads((run / "result.json").read_text())["profile"]["steps"] == [2, 3]
