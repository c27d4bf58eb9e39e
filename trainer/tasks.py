"""The task registry (`data.task`): each task declares its prompts, chat messages, rewards and what else it needs.

| task    | prompts                              | reward (weights from `rewards.*`)                          | eval split |
| ------- | ------------------------------------ | ---------------------------------------------------------- | ---------- |
| `arith` | "What is 3 + 4?" (sums up to 9)      | `exact` (the completion is the sum) + `number` (a bare number) | none   |
| `gsm8k` | GSM8K's train split, a system prompt | `correctness` + `format` + `tag_count`                      | `test`     |
| `toy`   | "Say something about apple 3."       | `toy`: the share of completion tokens in a target set (`toy_targets`) | none |

No JAX at import (the config imports this registry to check `eval.every`): `toy_targets` imports it when called.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.data import Example, load_gsm8k
from trainer.grpo.rewards import SYSTEM_PROMPT

ARITH_SYSTEM = "Answer with the number only."


def arith_examples() -> list[Example]:
    """Every `a + b` with single digits and a sum below 10 (55 questions), in a fixed order."""
    return [Example(f"What is {a} + {b}?", str(a + b)) for a in range(10) for b in range(10 - a)]


def toy_targets(cfg: Any, params: Any, mconf: Any, mesh: Any) -> frozenset[int]:
    """The toy task's hit tokens: the `data.toy_fraction` of the vocabulary whose output embedding points
    furthest along a seeded random direction of the hidden space, so one direction of the final hidden state
    reaches them all. (A set fixed by id, like the first quarter, is not learnable: random embeddings carry
    no id order.)"""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from trainer.model.qwen2 import lm_head_weight

    w_DV = lm_head_weight(params, mconf)
    d_D = jax.random.normal(jax.random.key(cfg.train.seed + 10_007), (w_DV.shape[0],), jnp.float32)
    proj = jax.jit(lambda w: d_D @ w.astype(jnp.float32), out_shardings=NamedSharding(mesh, P()))(w_DV)
    k = int(cfg.data.toy_fraction * w_DV.shape[1])
    return frozenset(np.argsort(-np.asarray(proj), kind="stable")[:k].tolist())


def toy_examples(n: int = 64) -> list[Example]:
    words = ["apple", "river", "stone", "cloud", "lamp", "field", "horse", "glass"]
    rng = random.Random(0)
    return [Example(f"Say something about {rng.choice(words)} {i}.", None) for i in range(n)]


@dataclass(frozen=True)
class Task:
    """A task as the trainer sees it; the loop and eval ask it, never its name. (Config is `Any` here: the
    config module imports this one.)"""

    name: str
    examples: Callable[[Any], list[Example]]  # (Config) -> the training prompts
    weights: Callable[[Any], dict[str, float]]  # (Config) -> reward name -> weight (grpo/rewards.py REGISTRY)
    system_prompt: str | None = None
    # (Config, params, model config, mesh) -> the token ids a reward counts as hits (Sample.target_ids)
    token_targets: Callable[[Any, Any, Any, Any], frozenset[int]] | None = None
    # (Config) -> the held-out prompts with gold answers that eval scores (pass@1); None: no eval
    eval_examples: Callable[[Any], list[Example]] | None = None

    def messages(self, ex: Example) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": ex.question}]


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            "arith",
            lambda cfg: arith_examples(),
            lambda cfg: {"number": cfg.rewards.number, "exact": cfg.rewards.exact},
            ARITH_SYSTEM,
        ),
        Task(
            "gsm8k",
            lambda cfg: load_gsm8k(cfg.data.path, "train", cfg.data.root),
            lambda cfg: {
                "correctness": cfg.rewards.correctness,
                "format": cfg.rewards.format,
                "tag_count": cfg.rewards.tag_count,
            },
            SYSTEM_PROMPT,
            eval_examples=lambda cfg: load_gsm8k(cfg.data.path, "test", cfg.data.root),
        ),
        Task(
            "toy", lambda cfg: toy_examples(), lambda cfg: {"toy": cfg.rewards.toy}, token_targets=toy_targets
        ),
    )
}


def get(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"data.task must be one of {sorted(TASKS)}, received {name!r}")
    return TASKS[name]
