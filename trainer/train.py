"""The GRPO loop: each step samples G completions per prompt, scores them, takes group-relative advantages
and applies one jitted update; the phases live in trainer/loop/ and pass a documented state (loop/state.py).
"""

from __future__ import annotations

from typing import Any

from trainer import metrics
from trainer.config import Config
from trainer.loop.record import finish, record, step_row
from trainer.loop.rollout import rollout
from trainer.loop.score import score_rollout
from trainer.loop.setup import setup
from trainer.loop.update import update
from trainer.profiling import StepTracer


def run(cfg: Config, emit: metrics.Emitter | None = None) -> dict[str, Any]:
    """Train; returns the summary (also printed as `summary: {json}`) with the final "params".

    A config that cannot run here (mesh, batch, prompt buckets) raises ConfigError (trainer.main: exit 2);
    SIGTERM ends the run after a step with SystemExit(143)."""
    run_, state = setup(cfg, emit)
    tracer = StepTracer(cfg, run_.emit)
    try:
        for step in range(state.start, cfg.train.steps):
            with tracer.step(step):
                with tracer.phase("rollout"):
                    ro = rollout(run_, state, step)
                with tracer.phase("score"):
                    sc = score_rollout(run_, ro)
                with tracer.phase("update"):
                    stats, t_update = update(run_, state, ro, sc)
                with tracer.phase("record"):
                    record(run_, state, step, step_row(state, ro, sc, stats, t_update))
    finally:
        tracer.stop()  # a run that ends (or stops) inside the traced steps keeps its trace
    return finish(run_, state)
