"""The update phase: the step's batch placed on the training mesh, `train.ppo_epochs` jitted updates."""

from __future__ import annotations

import time

import numpy as np

from trainer.distributed import global_array
from trainer.loop.state import Rollout, Run, Scores, State


def update(run: Run, state: State, ro: Rollout, sc: Scores) -> tuple[dict[str, float], float]:
    """Updates state.params and state.opt_state; returns (the last epoch's statistics, update seconds)."""
    full_ids = np.concatenate([ro.ids_NP, ro.comp_NC], axis=1)
    full_mask = np.concatenate([ro.mask_NP, ro.cmask_NC], axis=1)
    batch = {
        "ids": full_ids, "mask": full_mask, "pos": np.maximum(np.cumsum(full_mask, axis=1) - 1, 0).astype(np.int32),
        "comp": ro.comp_NC, "comp_mask": ro.cmask_NC, "old_logp": ro.old_NC.astype(np.float32),
        "adv": sc.adv_N.astype(np.float32),
    }  # fmt: skip
    gbatch = {k: global_array(run.mesh, np.asarray(v)) for k, v in batch.items()}
    p_len = ro.ids_NP.shape[1]
    if run.ref_logp is not None:
        gbatch["ref_logp"] = run.ref_logp(run.ref_params, gbatch, p_len)
    step_fn, steps = run.updates[p_len], np.int32(run.cfg.train.steps)  # an input: see programs.learning_rate
    t1 = time.perf_counter()
    for _ in range(run.cfg.train.ppo_epochs):
        state.params, state.opt_state, stats = step_fn(state.params, state.opt_state, gbatch, steps)
    out = {k: float(v) for k, v in stats.items()}
    return out, time.perf_counter() - t1
