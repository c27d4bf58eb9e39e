"""End-to-end GRPO steps of the tiny model on CPU: no recompiles, learning, equivalences across layouts."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainer import config, metrics, train


class Recorder(metrics.Emitter):
    """Keeps each step's values and the number of JAX compiles logged before the step line."""

    def __init__(self, compiles: list[str]) -> None:
        super().__init__(0)
        self.rows: list[dict[str, Any]] = []
        self.compiles_at_step: list[int] = []
        self._compiles = compiles

    def step(self, step: int, values: Mapping[str, Any]) -> None:
        super().step(step, values)
        self.rows.append(dict(values))
        self.compiles_at_step.append(len(self._compiles))


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("Compiling") or "TRACING CACHE MISS" in msg:
            self.messages.append(msg)


def run_toy(tmp_path: Path, *sets: str) -> Recorder:
    handler = _Collect()
    logging.getLogger("jax").addHandler(handler)
    try:
        cfg = config.load("toy", [f"log.output_dir={tmp_path / 'out'}", *sets])
        rec = Recorder(handler.messages)
        train.run(cfg, emit=rec)
    finally:
        logging.getLogger("jax").removeHandler(handler)
    return rec


@pytest.mark.slow
def test_20_steps_no_compile_after_step_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = run_toy(tmp_path, "train.steps=20", "log.log_compiles=true", "train.micro_batch=8")
    out = capsys.readouterr().out
    assert len(rec.rows) == 20 and rec.compiles_at_step[0] > 0
    assert rec.compiles_at_step[-1] == rec.compiles_at_step[0], "recompiled after step 0"
    assert out.count("\nstep=") + out.startswith("step=") == 20 and "summary: " in out
    assert all(np.isfinite(r["loss"]) for r in rec.rows)
