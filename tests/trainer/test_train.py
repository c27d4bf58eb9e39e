"""End-to-end GRPO steps of the tiny model on CPU: no recompiles, learning, equivalences across layouts."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.data import DATA
from tests.trainer.conftest import empty_tracing_cache
from trainer import config, metrics, train


class Recorder(metrics.Emitter):
    """Keeps each step's values and the number of JAX compiles logged before the step line."""

    def __init__(self, compiles: list[str]) -> None:
        super().__init__(0)
        self.rows: list[dict[str, Any]] = []
        self.compiles_at_step: list[int] = []
        self.result: dict[str, Any] = {}  # train.run's summary, with the final "params"
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
        cfg = config.load("toy", [f"log.output_dir={tmp_path / 'out'}", f"data.root={DATA}", *sets])
        rec = Recorder(handler.messages)
        rec.result = train.run(cfg, emit=rec)
    finally:
        logging.getLogger("jax").removeHandler(handler)
    return rec


def _tail_mean(rows: list[dict[str, Any]], n: int = 3) -> float:
    return float(np.mean([r["reward_mean"] for r in rows[-n:]]))


def _head_mean(rows: list[dict[str, Any]], n: int = 2) -> float:
    return float(np.mean([r["reward_mean"] for r in rows[:n]]))


@pytest.mark.slow
def test_12_steps_learn_without_compiling_after_step_0_and_flipped_advantages_unlearn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The update has the right sign and scale: +0.3 on the toy task; flipped, the reward falls. The 12 steps
    (2 micro-batches each, accumulated) compile nothing after step 0 (JAX's compile log). Both runs have the same
    micro-batches, so the same programs: the flipped run reads them from the session's compilation cache.
    Measured on seeds 0-2 (the bundled tokenizer): a rise of 0.66-0.78, a fall of 0.20-0.25."""
    sets = ("mesh.devices=1", "train.steps=12", "train.micro_batch=8")
    empty_tracing_cache()
    rec = run_toy(tmp_path, *sets, "log.log_compiles=true")
    out = capsys.readouterr().out
    up = rec.rows
    assert len(up) == 12 and rec.compiles_at_step[0] > 0
    assert rec.compiles_at_step[-1] == rec.compiles_at_step[0], "recompiled after step 0"
    assert out.count("\nstep=") + out.startswith("step=") == 12 and "summary: " in out
    # The batch arithmetic, printed before any compile: 2 prompts x G 8 = 16 sequences in micro-batches of 8.
    assert (
        "batch: prompts_per_step=2 samples_per_prompt=8 sequences_per_step=16 micro_batch=8 batch_devices=1 "
        "micro_batch_per_device=8 accumulation_steps=2\n" in out
    )
    assert all(np.isfinite(r["loss"]) for r in up)
    down = run_toy(tmp_path, *sets, "train.flip_advantages=true").rows
    assert up[0]["reward_mean"] == pytest.approx(down[0]["reward_mean"])  # the same start (seed, policy)
    assert _tail_mean(up) - _head_mean(up) >= 0.3, [r["reward_mean"] for r in up]
    assert _tail_mean(down) <= _head_mean(down) - 0.1, [r["reward_mean"] for r in down]


# One step of two PPO epochs: the second epoch's loss (ratio != 1) depends on the first update; an entropy bonus
# and a KL term keep the loss away from 0. Compared after one step only: a later step samples from the updated
# policy, and a float-rounding difference can flip a sampled token of the near-uniform tiny model.
SAME = ("train.steps=1", "train.micro_batch=8", "rollout.samples_per_prompt=4", "train.ppo_epochs=2",
        "loss.beta=0.04", "loss.entropy_coef=0.01", "loss.loss_type=grpo", "train.learning_rate=1e-3")  # fmt: skip


def _assert_same(a: Recorder, b: Recorder) -> None:
    import jax

    (ra,), (rb,) = a.rows, b.rows
    assert abs(ra["loss"]) > 1e-3 and ra["kl"] > 0  # the comparison is not between zeros
    for key in ("loss", "kl", "entropy", "reward_mean"):
        assert ra[key] == pytest.approx(rb[key], abs=1e-5), key
    assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-5)
    leaves_a = jax.tree_util.tree_leaves(a.result["params"])
    leaves_b = jax.tree_util.tree_leaves(b.result["params"])
    diff = np.concatenate([
        np.abs(np.asarray(x) - np.asarray(y)).ravel() for x, y in zip(leaves_a, leaves_b, strict=True)
    ])  # fmt: skip
    # Adam's first step is ~lr·sign(g): where g is within float rounding of zero (terms that cancel), another
    # layout's reduction order moves that parameter by a fraction of lr. Seen: 1 element of 9.8 million by
    # 0.12 lr on 2 slices (the 152k vocabulary), 1 of 98,880 on the bundled one; how many there are follows from
    # how many gradients cancel, not from the model's size. A wrong gradient moves thousands (and the loss, kl
    # and grad norm above): at most 1 in 100,000, and never fewer than 10, may differ by 0.1 lr; none by lr.
    lr = 1e-3
    assert float(diff.max()) < lr, f"parameters after the update differ by {float(diff.max())} (lr {lr})"
    loose = int((diff > 0.1 * lr).sum())
    assert loose <= max(diff.size // 100_000, 10), (
        f"{loose} of {diff.size} parameters differ by more than 0.1 lr"
    )


@pytest.fixture(scope="module")
def one_device(tmp_path_factory: pytest.TempPathFactory) -> Recorder:
    """The SAME step on one device, in one micro-batch: what the layouts below are compared with."""
    return run_toy(tmp_path_factory.mktemp("one-device"), *SAME, "mesh.devices=1")


@pytest.mark.slow
def test_same_losses_on_one_device_and_on_a_1_4_2_mesh(tmp_path: Path, one_device: Recorder) -> None:
    mesh = run_toy(tmp_path, *SAME, "mesh.dp=1", "mesh.fsdp=4", "mesh.tp=2")
    _assert_same(one_device, mesh)


@pytest.mark.slow
def test_same_losses_with_4x2_accumulation_and_1x8(tmp_path: Path, one_device: Recorder) -> None:
    accumulated = run_toy(tmp_path, *SAME, "mesh.devices=1", "train.micro_batch=2")
    _assert_same(one_device, accumulated)


@pytest.mark.slow
def test_the_step_metrics_are_token_means_when_completions_end_at_different_lengths(tmp_path: Path) -> None:
    """On the bundled tokenizer's 384 rows the tiny model samples its end-of-sequence token, so micro-batches
    hold different numbers of tokens. 4 accumulated micro-batches of 2 then print the kl, entropy and loss of
    one batch of 8: each micro-batch's token mean weighted by its tokens (a plain mean of the 4 means printed
    kl 0.2807 against 0.2892)."""
    (one,) = run_toy(tmp_path / "one", *SAME, "mesh.devices=1").rows  # the toy preset: the bundled tokenizer
    (four,) = run_toy(tmp_path / "four", *SAME, "mesh.devices=1", "train.micro_batch=2").rows
    assert one["completion_len_mean"] < one["completion_len_max"]  # some completions ended early
    assert abs(one["loss"]) > 1e-3 and one["kl"] > 0
    for key in ("loss", "kl", "entropy", "reward_mean", "kl_old", "clip_frac"):
        assert four[key] == pytest.approx(one[key], abs=1e-5), key
    assert four["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)


@pytest.mark.slow
def test_same_losses_on_two_slices_of_a_1_2_2_mesh_with_2_micro_batches(
    tmp_path: Path, one_device: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 devices as 2 slices (MEGASCALE_NUM_SLICES, as the run step sets it): mesh dcn 2 x dp 1 x fsdp 2 x tp 2;
    each slice sums its rows' gradients over 2 micro-batches, then one reduction over dcn."""
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "2")
    sliced = run_toy(tmp_path, *SAME, "mesh.tp=2", "train.micro_batch=4")
    _assert_same(one_device, sliced)
