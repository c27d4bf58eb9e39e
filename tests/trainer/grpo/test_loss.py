"""The GRPO objective and its gradient against a NumPy transcription of the formulas (all four aggregations)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer.config import LossConfig
from trainer.grpo.advantages import group_advantages
from trainer.grpo.loss import grpo_objective

# Dims: B sequences, T completion tokens.
B, T = 6, 7


def numpy_loss(logp, old, ref, adv, mask, ent, cfg: LossConfig, dapo_tokens=None) -> float:
    ratio = np.exp(logp - old)
    a = adv[:, None]
    surr = -np.minimum(ratio * a, np.clip(ratio, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high) * a)
    if ref is not None and cfg.beta > 0:
        surr = surr + cfg.beta * (np.exp(ref - logp) - (ref - logp) - 1)
    surr = surr - cfg.entropy_coef * ent
    m = mask.astype(np.float64)
    if cfg.loss_type == "grpo":
        return float(np.mean((surr * m).sum(1) / np.maximum(m.sum(1), 1)))
    if cfg.loss_type == "bnpo":
        return float((surr * m).sum() / m.sum())
    if cfg.loss_type == "dr_grpo":
        return float((surr * m).sum() / (B * (cfg.max_completion_len or T)))
    return float((surr * m).sum() / (m.sum() if dapo_tokens is None else dapo_tokens))


def numpy_grad(logp, *rest, eps: float = 1e-6) -> np.ndarray:
    """Central differences in float64: the gradient of the transcription with respect to logp."""
    g = np.zeros_like(logp)
    for idx in np.ndindex(logp.shape):
        up, down = logp.copy(), logp.copy()
        up[idx] += eps
        down[idx] -= eps
        g[idx] = (numpy_loss(up, *rest) - numpy_loss(down, *rest)) / (2 * eps)
    return g


@pytest.fixture(scope="module")
def inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    logp = rng.normal(-2.0, 0.5, (B, T))
    # old ≠ new by up to ±0.6 in log space: many ratios fall outside [0.8, 1.28].
    old = logp + rng.uniform(-0.6, 0.6, (B, T))
    ref = logp + rng.normal(0, 0.3, (B, T))
    adv = np.array([1.5, -0.7, 0.3, -2.0, 0.9, -0.1])  # both signs
    mask = np.ones((B, T), bool)
    for b, n in enumerate([7, 5, 3, 7, 1, 6]):  # ragged completions
        mask[b, n:] = False
    ent = rng.uniform(0.5, 3.0, (B, T))
    return {"logp": logp, "old": old, "ref": ref, "adv": adv, "mask": mask, "ent": ent}


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_and_grad_match_numpy(inputs: dict[str, np.ndarray], loss_type: str, beta: float) -> None:
    cfg = LossConfig(
        loss_type=loss_type,
        beta=beta,
        entropy_coef=0.01,
        max_completion_len=9 if loss_type == "dr_grpo" else 0,
    )
    x = inputs
    ratio = np.exp(x["logp"] - x["old"])
    assert ((ratio < 0.8) & x["mask"]).any() and ((ratio > 1.28) & x["mask"]).any()  # the clip is exercised
    ref = x["ref"] if beta else None
    f32 = {k: np.asarray(v, np.float32) for k, v in x.items()}

    def f(logp):
        return grpo_objective(
            logp, f32["old"], f32["ref"] if beta else None, f32["adv"], f32["mask"], f32["ent"], cfg
        )[0]

    loss, grad = jax.value_and_grad(f)(f32["logp"])
    rest = (x["old"], ref, x["adv"], x["mask"], x["ent"], cfg)
    np.testing.assert_allclose(float(loss), numpy_loss(x["logp"], *rest), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), numpy_grad(x["logp"], *rest), rtol=1e-4, atol=1e-6)
    assert not np.asarray(grad)[~x["mask"]].any()  # padding gets no gradient


def test_dapo_normaliser_makes_accumulation_exact(inputs: dict[str, np.ndarray]) -> None:
    """Two halves with the step's token count: their mean loss equals the whole batch's loss."""
    cfg = LossConfig(loss_type="dapo")
    x = {k: np.asarray(v, np.float32) for k, v in inputs.items()}
    args = lambda s: (x["logp"][s], x["old"][s], None, x["adv"][s], x["mask"][s], x["ent"][s], cfg)  # noqa: E731
    whole = float(grpo_objective(*args(slice(None)))[0])
    per_micro = x["mask"].sum() / 2
    halves = [float(grpo_objective(*args(s), dapo_tokens=per_micro)[0]) for s in (slice(0, 3), slice(3, 6))]
    np.testing.assert_allclose(np.mean(halves), whole, rtol=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_the_slices_shares_sum_to_the_micro_batch_loss(inputs: dict[str, np.ndarray], loss_type: str) -> None:
    """A micro-batch split over slices (rows 0-1 and 2-5: unequal parts, unequal token counts): given the whole
    micro-batch's rows and tokens, the parts' losses and statistics sum to the whole's (the update psums them)."""
    cfg = LossConfig(loss_type=loss_type, beta=0.04, entropy_coef=0.01)
    x = {k: np.asarray(v, np.float32) for k, v in inputs.items()}
    args = lambda s: (x["logp"][s], x["old"][s], x["ref"][s], x["adv"][s], x["mask"][s], x["ent"][s], cfg)  # noqa: E731
    loss, aux = grpo_objective(*args(slice(None)), dapo_tokens=20.0)
    whole = (B, jnp.float32(x["mask"].sum()))
    parts = [grpo_objective(*args(s), dapo_tokens=20.0, whole=whole) for s in (slice(0, 2), slice(2, 6))]
    np.testing.assert_allclose(sum(float(p[0]) for p in parts), float(loss), rtol=1e-6)
    for key in aux:
        np.testing.assert_allclose(
            sum(float(p[1][key]) for p in parts), float(aux[key]), rtol=1e-6, err_msg=key
        )


def test_clip_fractions_count_the_clipped_side(inputs: dict[str, np.ndarray]) -> None:
    x = {k: np.asarray(v, np.float32) for k, v in inputs.items()}
    cfg = dataclasses.replace(LossConfig(), loss_type="bnpo")
    _, aux = grpo_objective(x["logp"], x["old"], None, x["adv"], x["mask"], x["ent"], cfg)
    ratio, a, m = np.exp(x["logp"] - x["old"]), x["adv"][:, None], x["mask"].astype(bool)
    expect_high = (((ratio > 1.28) & (a > 0)) & m).sum() / m.sum()
    np.testing.assert_allclose(float(aux["clip_high_frac"]), expect_high, rtol=1e-6)
    np.testing.assert_allclose(float(aux["entropy"]), (x["ent"] * m).sum() / m.sum(), rtol=1e-6)


def test_group_advantages_bessel_and_dr_grpo() -> None:
    r = np.array([1.0, 0.0, 0.5, 0.5, 2.0, 2.0, 3.0, 7.0], np.float32)
    got = np.asarray(group_advantages(r, 4))
    for g in range(2):
        grp = r[4 * g : 4 * g + 4]
        np.testing.assert_allclose(
            got[4 * g : 4 * g + 4], (grp - grp.mean()) / (grp.std(ddof=1) + 1e-4), rtol=1e-5
        )
    np.testing.assert_allclose(
        np.asarray(group_advantages(r, 4, "none")), r - np.repeat(r.reshape(2, 4).mean(1), 4), rtol=1e-6
    )
    assert not np.asarray(group_advantages(np.ones(4, np.float32), 4)).any()  # equal rewards: no signal
    # Also where float32 cannot hold the group mean exactly (0.9 × 8 / 8 rounds): not ~6e-8 / 1e-4 = -6e-4.
    for n in (16, 64):  # as train.run passes them: a jax array (XLA's mean, not numpy's exact pairwise sum)
        assert not np.asarray(group_advantages(jnp.asarray(np.full(n, 0.9, np.float32)), 8)).any(), n
