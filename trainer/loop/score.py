"""The score phase: decode the completions, reward them (the task's weights) and turn rewards into advantages."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from trainer.grpo.advantages import group_advantages
from trainer.grpo.rewards import Sample, score
from trainer.loop.state import Rollout, Run, Scores
from trainer.tokenizer import decode

# One program for the advantages (compiled at step 0 with the rollout's, reused every step): run eagerly, each
# of its dozen ops compiled a program of its own in every new process.
_group_advantages = jax.jit(group_advantages, static_argnums=(1, 2))


def score_rollout(run: Run, ro: Rollout) -> Scores:
    """Rewards of every completion (a raising reward function is counted on a `reward_errors` line) and the
    group-relative advantages (negated with train.flip_advantages)."""
    cfg, G = run.cfg, run.cfg.rollout.samples_per_prompt
    t_start = time.perf_counter()
    texts = decode(run.tokenizer, ro.comp_NC, ro.cmask_NC)
    samples = [
        Sample(
            text,
            ro.prompts[i // G].gold,
            tuple(ro.comp_NC[i][ro.cmask_NC[i].astype(bool)].tolist()),
            run.target_ids,
        )
        for i, text in enumerate(texts)
    ]
    scores = score(samples, run.weights)
    for name, count in scores.errors.items():
        run.emit.reward_errors(ro.step, name, count)
    adv_N = np.asarray(_group_advantages(jnp.asarray(scores.total_N), G, cfg.loss.scale_rewards))
    if cfg.train.flip_advantages:
        adv_N = -adv_N
    return Scores(scores.total_N, dict(scores.per_name), adv_N, time.perf_counter() - t_start)
