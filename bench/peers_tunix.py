"""google-tunix's GRPO step on a workload given as JSON: run by bench/bench_peers.py in tunix's own venv.

Not importable from the project's environment (tunix pins safetensors<0.8): bench_peers.py starts it with
the tunix venv's python, passes the workload (model shapes, chat-templated prompts, G, lengths, steps) as a
JSON file and reads one JSON result line (`peers_tunix: {...}`) from its stdout.
tunix's own pieces only: its Qwen2 (`tunix.models.qwen2`), random weights from
`tunix.models.dummy_model_creator`, `RLCluster` with the `vanilla` rollout engine on one mesh shared by the
actor and the rollout, and `GRPOLearner` (beta 0: no reference model; token-mean loss; one iteration).
Step times: the reward function is called once per step, between the rollout and the update, so the time
between two calls is one whole step (the update of one, the rollout of the next). The first interval holds
the update's compile and is left out; medians of the rest.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from transformers import PreTrainedTokenizerFast
    from tunix.models.dummy_model_creator import create_dummy_model
    from tunix.models.qwen2 import model as qwen2
    from tunix.rl import rl_cluster as rl
    from tunix.rl.grpo.grpo_learner import GRPOConfig, GRPOLearner
    from tunix.rl.rollout import base_rollout

    m, w = spec["model"], spec["workload"]
    N, G, P, C = w["prompts"], w["samples"], w["prompt_len"], w["new_tokens"]
    # Auto axes (a plain Mesh): tunix's Qwen2 leaves the shardings of its gathers to XLA.
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    config = qwen2.ModelConfig(
        num_layers=m["num_hidden_layers"], vocab_size=m["vocab_size"], embed_dim=m["hidden_size"],
        hidden_dim=m["intermediate_size"], num_heads=m["num_attention_heads"], head_dim=m["head_dim"],
        num_kv_heads=m["num_key_value_heads"], rope_theta=int(m["rope_theta"]), norm_eps=m["rms_norm_eps"],
        use_tied_embedding=m["tie_word_embeddings"], dtype=jnp.dtype(m["dtype"]), param_dtype=jnp.float32,
    )  # fmt: skip
    t0 = time.perf_counter()
    model = create_dummy_model(qwen2.Qwen2, config, mesh=mesh, scale=m["initializer_range"])
    init_s = time.perf_counter() - t0
    tokenizer = PreTrainedTokenizerFast.from_pretrained(spec["tokenizer"], local_files_only=True)

    calls: list[float] = []
    generated: list[int] = []

    def length_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        """A cheap reward with a spread (GRPO needs unequal rewards in a group); also the step clock."""
        calls.append(time.perf_counter())
        generated.append(sum(len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in completions))
        return [float(len(c) % 7) for c in completions]

    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=C, max_prompt_length=P, kv_cache_size=P + C, temperature=w["temperature"],
        top_p=1.0, top_k=None, eos_tokens=spec["eos_ids"],
    )  # fmt: skip
    training = rl.RLTrainingConfig(
        actor_optimizer=optax.adamw(w["learning_rate"]),
        eval_every_n_steps=10**9,
        max_steps=w["steps"],
        mini_batch_size=N,
        train_micro_batch_size=w.get("micro_batch") or N,
        checkpoint_root_directory=None,
        metrics_logging_options=None,
    )
    cluster = rl.RLCluster(
        actor=model,
        tokenizer=tokenizer,
        cluster_config=rl.ClusterConfig(
            role_to_mesh={rl.Role.ACTOR: mesh, rl.Role.REFERENCE: mesh, rl.Role.ROLLOUT: mesh},
            rollout_engine="vanilla",
            offload_to_cpu=False,
            training_config=training,
            rollout_config=rollout,
        ),
    )
    algo = GRPOConfig(num_generations=G, num_iterations=1, beta=0.0, epsilon=0.2, loss_agg_mode="token-mean")
    learner = GRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=[length_reward])
    batches = [{"prompts": np.asarray(p)} for p in spec["prompts_per_step"]]  # each step's N prompts
    t0 = time.perf_counter()
    with mesh:
        learner.train(batches)
    total_s = time.perf_counter() - t0
    # tunix may call the reward function more than once per step (its rollout in parts: on the GPU, micro-batch
    # 8 of 128 sequences gave 2 calls per step): a step starts at every k-th call.
    k = max(len(calls) // w["steps"], 1) if len(calls) % w["steps"] == 0 else 1
    intervals = np.diff(calls[::k]).tolist()
    timed = intervals[1:]
    generated = [sum(generated[i : i + k]) for i in range(0, len(generated) - k + 1, k)]
    result = {
        "tunix": _version("google-tunix"),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "init_s": init_s,
        "train_s": total_s,
        "run_s": init_s + total_s,  # model made, every step with its compiles
        "reward_calls": len(calls),
        "reward_calls_per_step": k,
        "step_intervals_s": intervals,
        "step_s": statistics.median(timed) if timed else None,
        "first_step_s": calls[0] - t0 if calls else None,
        "generated_tokens_per_step": statistics.median(generated) if generated else None,
    }
    print("peers_tunix: " + json.dumps(result), flush=True)
    return 0


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
