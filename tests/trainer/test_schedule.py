"""The learning-rate schedule: optax's warmup-cosine decay, with the run's length an input of the update, so a
3-step smoke run and the real run share one compiled update, and a run no longer than its warm-up runs."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from trainer import config
from trainer.fit import programs
from trainer.kernels import resolve_impl
from trainer.loop.programs import learning_rate, optimizer


@pytest.mark.parametrize(("warmup", "steps"), [(0, 1), (0, 2), (0, 40), (3, 4), (3, 11), (10, 11), (10, 200)])
def test_the_schedule_is_optaxs_warmup_cosine_decay_where_optax_takes_the_lengths(
    warmup: int, steps: int
) -> None:
    lr = 3e-6
    cfg = config.load("tiny", [f"train.learning_rate={lr}", f"train.warmup_steps={warmup}"])
    theirs = optax.warmup_cosine_decay_schedule(
        0.0 if warmup else lr, lr, max(warmup, 1), max(steps, 2), 0.1 * lr
    )
    ours = learning_rate(cfg, np.int32(steps))
    counts = np.arange(steps + 3, dtype=np.int32)
    got = np.array([ours(c) for c in counts])
    want = np.array([theirs(c) for c in counts])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[-1] == pytest.approx(0.1 * lr) and got.max() == pytest.approx(lr)


def test_a_run_no_longer_than_its_warm_up_rises_then_stays_at_the_peak() -> None:
    cfg = config.load("qwen2.5-1.5b-v6e-8", ["train.steps=3"])  # warmup_steps 10: optax raised here
    lr, warmup = cfg.train.learning_rate, cfg.train.warmup_steps
    assert warmup == 10
    optimizer(cfg)  # builds (it was "cosine_decay_schedule requires positive decay_steps, got -7")
    got = [float(learning_rate(cfg, np.int32(3))(np.int32(c))) for c in range(14)]
    np.testing.assert_allclose(got[: warmup + 1], [lr * c / warmup for c in range(warmup + 1)], rtol=1e-6)
    assert got[warmup:] == [pytest.approx(lr)] * 4


def _update_text(*sets: str) -> str:
    """The tiny model's update as lowered for one CPU device (what the compilation cache keys on)."""
    cfg = config.load("tiny", list(sets))
    mconf = programs.model_config(cfg)
    mesh = programs.training_mesh(cfg, jax.devices()[:1])
    params, opt_state = programs.state(cfg, mconf, mesh)
    impl = resolve_impl(cfg.train.loss_impl, "cpu")
    (update,) = programs._update(cfg, mconf, mesh, params, opt_state, impl)
    return update.lowered.as_text()


def test_runs_that_differ_only_in_their_length_lower_the_same_update() -> None:
    short = _update_text("train.steps=3", "train.warmup_steps=2")
    assert short == _update_text("train.steps=200", "train.warmup_steps=2")
    assert short != _update_text("train.steps=3", "train.warmup_steps=1")  # what is compiled in still differs
