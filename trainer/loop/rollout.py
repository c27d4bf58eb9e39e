"""The rollout phase: draw the step's prompts and sample G completions each on the decode mesh."""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from trainer import data
from trainer.config import ConfigError
from trainer.distributed import global_array, to_host
from trainer.loop.remat import device_bytes, update_program
from trainer.loop.state import Rollout, Run, State
from trainer.model import flash
from trainer.sampling.sampler import generate
from trainer.tokenizer import chat_text, encode_chat


def draw_prompts(run: Run, stream: data.PromptStream, n: int) -> list[data.Example]:
    """n examples whose chat prompt fits the largest bucket (longer ones are skipped, the same on every process)."""
    limit = max(run.cfg.data.prompt_buckets)
    out: list[data.Example] = []
    tried = 0
    while len(out) < n:
        ex = stream.next_global(1)[0]
        tried += 1
        if tried > len(stream.examples) and not out:
            raise ConfigError(f"no prompt fits data.prompt_buckets (largest {limit} tokens); raise it")
        text = chat_text(run.tokenizer, run.task.messages(ex))
        if len(run.tokenizer(text, add_special_tokens=False)["input_ids"]) <= limit:
            out.append(ex)
    return out


def rollout(run: Run, state: State, step: int) -> Rollout:
    """Step `step`'s prompts (each repeated G times) and completions, gathered to every process."""
    cfg, G = run.cfg, run.cfg.rollout.samples_per_prompt
    t0 = time.perf_counter()
    prompts = draw_prompts(run, state.stream, cfg.train.prompts_per_step)
    buckets = [max(cfg.data.prompt_buckets)] if cfg.data.fixed_bucket else cfg.data.prompt_buckets
    ids_PP, mask_PP = encode_chat(run.tokenizer, [run.task.messages(ex) for ex in prompts], buckets)
    p_len = ids_PP.shape[1]
    if p_len not in run.updates:  # a bucket not seen yet: its update compiles now, as its rollout will
        like = (state.params, state.opt_state)
        resident = device_bytes(run.ref_params)
        run.updates[p_len] = update_program(
            cfg, run.mconf, p_len, run.impl, like, resident_bytes=resident, say=run.emit.line
        )
    ids_NP, mask_NP = np.repeat(ids_PP, G, axis=0), np.repeat(mask_PP, G, axis=0)
    rng = jax.random.fold_in(jax.random.key(cfg.train.seed), step)
    out = _generate(run, run.to_decode(state.params), ids_NP, mask_NP, rng, G)
    comp_NC, cmask_NC, old_NC = (
        to_host(out.completion_ids_BC),
        to_host(out.completion_mask_BC),
        to_host(out.logprobs_BC),
    )
    return Rollout(step, t0, prompts, ids_NP, mask_NP, comp_NC, cmask_NC, old_NC, time.perf_counter() - t0)


def _generate(
    run: Run, rparams: Any, ids_NP: np.ndarray, mask_NP: np.ndarray, rng: jax.Array, samples: int
) -> Any:
    # A function of its own so the decode-layout weights are freed as it returns, before the update.
    mconf = run.mconf.replace(  # the prefill attends as train.attention_impl picks for this bucket
        attention=flash.resolve(run.cfg.train.attention_impl, ids_NP.shape[1], strict=False)
    )
    return generate(
        rparams, mconf, global_array(run.rmesh, ids_NP), global_array(run.rmesh, mask_NP), rng,
        run.sampling, run.eos, run.pad, mesh=run.rmesh, samples=samples,
    )  # fmt: skip
