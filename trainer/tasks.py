"""The task registry: each task's training prompts, chat messages and reward weights (`data.task`).

| task    | prompts                              | reward (weights from `rewards.*`)                          |
| ------- | ------------------------------------ | ---------------------------------------------------------- |
| `arith` | "What is 3 + 4?" (sums up to 9)      | `exact` (the completion is the sum) + `number` (a bare number) |
| `gsm8k` | GSM8K's train split, a system prompt | `correctness` + `format` + `tag_count`                      |
| `toy`   | "Say something about apple 3."       | `toy`: the share of completion tokens in a target set      |
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


def toy_examples(n: int = 64) -> list[Example]:
    words = ["apple", "river", "stone", "cloud", "lamp", "field", "horse", "glass"]
    rng = random.Random(0)
    return [Example(f"Say something about {rng.choice(words)} {i}.", None) for i in range(n)]


@dataclass(frozen=True)
class Task:
    name: str
    examples: Callable[[Any], list[Example]]  # (Config) -> the training prompts
    weights: Callable[[Any], dict[str, float]]  # (Config) -> reward name -> weight (grpo/rewards.py REGISTRY)
    system_prompt: str | None = None
    token_targets: bool = False  # the reward looks at token ids (train.toy_targets)

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
        ),
        Task("toy", lambda cfg: toy_examples(), lambda cfg: {"toy": cfg.rewards.toy}, token_targets=True),
    )
}


def get(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"data.task must be one of {sorted(TASKS)}, received {name!r}")
    return TASKS[name]
