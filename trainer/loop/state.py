"""The state passed between the phases: `Run` (fixed once set up), `State` (carried across steps), and one
step's `Rollout` and `Scores`.

Dims: N sequences per step (prompts × G), P prompt bucket, C = rollout.max_new_tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from jax.sharding import Mesh

from trainer import data, metrics, tasks
from trainer.config import Config
from trainer.layout import OnMesh
from trainer.loop.stop import StopNotice
from trainer.sampling.sampler import SamplingConfig


@dataclass
class Run:
    """Everything fixed for the run, built by setup.setup; the phases read it and change only `updates`."""

    cfg: Config
    emit: metrics.Emitter
    mesh: Mesh  # the training mesh (dp, fsdp, tp)
    rmesh: Mesh  # the decode mesh of the same devices (rollout.tp)
    to_decode: Callable[[Any], Any]  # params -> the decode layout's weights (cast once per step)
    mconf: Any  # the model config (trainer.model)
    tokenizer: Any
    task: tasks.Task
    weights: dict[str, float]  # reward name -> weight, from the task
    target_ids: frozenset[int] | None  # the task's token targets (toy), else None
    sampling: SamplingConfig
    eos: Any  # token ids that end a completion
    pad: int
    impl: str  # the loss implementation train.loss_impl resolved to
    updates: dict[int, Callable[..., Any]]  # prompt length P -> the update (one compile per bucket seen)
    ref_params: Any  # the frozen reference policy (loss.beta > 0), else None
    ref_logp: OnMesh | None  # (ref_params, batch, P) -> reference log-probs [N, C]
    ckpt: Any  # the orbax checkpoint manager, or None without checkpoint.dir
    notice: StopNotice
    wandb_run: Any  # the W&B run, or None


@dataclass
class State:
    """What the steps change: the weights, the optimizer, the prompt stream's position and the step rows."""

    params: Any
    opt_state: Any
    stream: data.PromptStream
    start: int  # the first step of this process (a resume starts after the checkpoint's)
    history: list[dict[str, float]] = field(default_factory=list)  # each step line's values, in order


@dataclass
class Rollout:
    """One step's prompts and sampled completions (host arrays, the same on every process)."""

    step: int
    t0: float  # perf_counter at the step's start
    prompts: list[data.Example]
    ids_NP: np.ndarray  # prompt tokens, left-padded, each prompt repeated G times
    mask_NP: np.ndarray
    comp_NC: np.ndarray  # completion tokens
    cmask_NC: np.ndarray  # 1 up to and including EOS
    old_NC: np.ndarray  # the sampler's log-probs of the completion tokens
    seconds: float  # rollout_generate


@dataclass
class Scores:
    """One step's rewards and group-relative advantages."""

    total_N: np.ndarray  # the weighted reward of each sequence
    per_name: dict[str, float]  # each reward function's mean before weighting
    adv_N: np.ndarray
    seconds: float  # reward_score
