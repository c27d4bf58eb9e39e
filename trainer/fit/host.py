"""The host's share of a step, timed on this machine at the config's shapes: what a step does on the CPU between
its TPU programs (the score phase: decode N completions of C tokens to text, reward them, group advantages).

The device waits for it (the update needs the advantages), so it adds to the step. The completions are random
token ids of the full C tokens (the worst case, as the decode is counted); the tokenizer is the real Qwen2.5 one
where <data.root>/qwen2.5-tokenizer exists (docs/trainer.md), else the bundled one (named in the result).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "tokenizer"


def _tokenizer(cfg: Any) -> tuple[Any, str]:
    from trainer import data
    from trainer.tokenizer import load_tokenizer

    real = data.data_dir(cfg.data.root) / "qwen2.5-tokenizer"
    folder = real if (real / "tokenizer.json").is_file() else ASSETS
    return load_tokenizer(folder), "qwen2.5" if folder == real else "bundled"


def measure(cfg: Any, repeats: int = 3) -> dict[str, Any]:
    """{"seconds": median over `repeats` of one step's host work, "tokenizer": which, "sequences", "tokens"}."""
    import jax.numpy as jnp

    from trainer import tasks
    from trainer.grpo.advantages import group_advantages
    from trainer.grpo.rewards import Sample, score
    from trainer.tokenizer import decode

    tok, which = _tokenizer(cfg)
    N, C, G = cfg.sequences_per_step, cfg.rollout.max_new_tokens, cfg.rollout.samples_per_prompt
    ids_NC = np.random.default_rng(0).integers(0, min(len(tok), 150_000), size=(N, C))
    weights = tasks.get(cfg.data.task).weights(cfg)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        texts = decode(tok, ids_NC, np.ones_like(ids_NC))  # what trainer.loop.score does
        samples = [Sample(t, "42", tuple(row.tolist())) for t, row in zip(texts, ids_NC, strict=True)]
        total_N = score(samples, weights).total_N
        np.asarray(group_advantages(jnp.asarray(total_N), G, cfg.loss.scale_rewards))
        times.append(time.perf_counter() - t0)
    return {"seconds": float(np.median(times)), "tokenizer": which, "sequences": N, "tokens": N * C}
