"""What device_step.py times: the sizes and their workloads, random weights made on the device, GSM8K prompts
through the real tokenizer, and the update's batch as the trainer builds it from a rollout; and a profile's
kernels summed by name (`summarize_trace`, device_step's update profile and device_decode's)."""

from __future__ import annotations

import gzip
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "data"
# size -> (trainer preset whose settings the step uses, HF config of the shapes, default micro-batch, time share:
# compiles cost about the same at every depth (the layer scan), so the small sizes get more than their steps need)
SIZES: dict[str, tuple[str, str | None, int, float]] = {
    "tiny": ("tiny", None, 4, 1.0),
    "0.5b": ("qwen2.5-0.5b-v4-8", "Qwen2.5-0.5B-Instruct.json", 16, 0.28),
    "1.5b": ("qwen2.5-1.5b-v6e-8", "Qwen2.5-1.5B-Instruct.json", 16, 0.32),
    "3b": ("qwen2.5-3b-v6e-8", "Qwen2.5-3B-Instruct.json", 8, 0.40),
    # the seed's workload: its preset's 1024 new tokens and attention windows (rollout.attention_block)
    "3b-seed": ("qwen2.5-3b-v6e-8-seed", "Qwen2.5-3B-Instruct.json", 8, 1.0),
}
# tiny: a CPU check of the script, not a benchmark (2 prompts x 2 samples, 16 new tokens: rollout.attention_impl=
# pallas takes multiples of 16).
TINY = {"prompts": 2, "samples": 2, "prompt_len": 256, "new_tokens": 16, "steps": 2}


def _env(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


def workload(size: str) -> dict[str, int]:
    base = dict(TINY) if size == "tiny" else {"prompts": 16, "samples": 8, "prompt_len": 512, "new_tokens": 512,
                                               "steps": 3}  # fmt: skip
    return {
        "prompts": _env("DEVICE_STEP_PROMPTS", base["prompts"]),
        "samples": _env("DEVICE_STEP_SAMPLES", base["samples"]),
        "prompt_len": _env("DEVICE_STEP_PROMPT_LEN", base["prompt_len"]),
        "new_tokens": _env("DEVICE_STEP_NEW_TOKENS", 1024 if size == "3b-seed" else base["new_tokens"]),
        "steps": _env("DEVICE_STEP_STEPS", base["steps"]),
        "micro_batch": _env("DEVICE_STEP_MICRO", SIZES[size][2]),
    }


def trainer_sets(size: str, dtype: str, w: dict[str, int]) -> list[str]:
    """The trainer overrides a size's step runs with (on the preset SIZES names): the workload's shapes, one
    device's layout, then DEVICE_STEP_LAYERS and a variant's DEVICE_STEP_SETS (last, so they win)."""
    return [
        "model.path=tiny", f"model.dtype={dtype}", "data.task=gsm8k", f"data.root={FIXTURES}",
        f"data.prompt_buckets={w['prompt_len']}", "data.fixed_bucket=true",
        f"rollout.samples_per_prompt={w['samples']}", f"rollout.max_new_tokens={w['new_tokens']}",
        f"train.prompts_per_step={w['prompts']}", "mesh.accelerator=", "log.wandb=disabled", "eval.every=0",
        f"rollout.decode_layers={os.environ.get('DEVICE_STEP_LAYERS', 'auto')}",
        "rollout.tp=0",  # the layout for the devices at hand (the presets name a TPU slice's tp)
        *os.environ.get("DEVICE_STEP_SETS", "").split(),  # a variant's overrides, last so they win
    ]  # fmt: skip


def compile_update(
    cfg: Any, mconf: Any, P_len: int, impl: str, args: tuple[Any, ...], micro: int, limit: int | None,
    in_use: int, say: Any = print,
) -> dict[str, Any]:  # fmt: skip
    """The update compiled ahead of time, so its memory is known before it runs: at `micro` sequences a
    micro-batch, halved until its temporaries and outputs fit in 92% of what is free beside the state (`limit` -
    `in_use`, the device's bytes_limit and bytes_in_use; no limit known: the first micro-batch), `train.remat: auto`
    resolved at each micro-batch as a run resolves it (trainer.loop.remat, its winner's executable kept). `args`:
    the update's arguments (arrays, or ShapeDtypeStructs for a compile without the device). Returns {executable,
    micro_batch, need, free, remat (the choice or None), compiles (programs compiled, candidates included)}."""
    from trainer import config
    from trainer.loop.programs import make_update
    from trainer.loop.remat import AutoUpdate
    from trainer.sharding import batch_devices

    params, opt_state = args[0], args[1]
    mesh = jax_mesh(params)
    free = (limit - in_use) if limit else 0
    compiles = 0
    while True:
        ucfg = config.with_sets(cfg, [f"train.micro_batch={micro}"])
        ucfg.check_batch(1, batch_devices(mesh))
        choice = None
        if ucfg.train.remat == "auto":  # the trainer's choice (trainer.loop.remat), its executable kept
            auto = AutoUpdate(ucfg, mconf, P_len, impl, (params, opt_state), device_bytes=limit, say=say)
            choice = auto.resolve(*args)
            compiles += len(choice.peaks)
            ucfg = config.with_sets(ucfg, [f"train.remat={choice.policy}"])
            update = auto.executable
        else:
            update = None
        if update is None:
            update = make_update(ucfg, mconf, P_len, impl, (params, opt_state)).lower(*args).compile()
            compiles += 1
        mem = update.memory_analysis()
        assert mem is not None, "the backend reports no compiled memory"
        need = int(mem.temp_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes)
        say(f"update compiled at micro-batch {micro}: needs {need / 1e9:.1f} GB beyond the state, "
            f"{free / 1e9:.1f} GB free" if free else f"update compiled at micro-batch {micro}")  # fmt: skip
        if not free or need <= 0.92 * free or micro == 1:
            return {"executable": update, "micro_batch": micro, "need": need, "free": free, "remat": choice,
                    "compiles": compiles}  # fmt: skip
        micro //= 2


def commit() -> str:
    """This checkout's commit (7 digits), which the results name."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=False)  # fmt: skip
        return out.stdout.strip() or "unknown (no git here)"
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git here)"


def jax_mesh(tree: Any) -> Any:
    """The mesh of a pytree's first leaf (an array's or a ShapeDtypeStruct's NamedSharding)."""
    import jax

    return jax.tree_util.tree_leaves(tree)[0].sharding.mesh


def model_shapes(size: str, dtype: str) -> Any:
    from trainer.model.config import Qwen2Config, preset

    hf = SIZES[size][1]
    if hf is None:
        return preset("tiny").replace(dtype=dtype)
    return Qwen2Config.from_hf(json.loads((FIXTURES / "qwen2.5-configs" / hf).read_text()), dtype=dtype)


def random_params(mconf: Any, mesh: Any, seed: int) -> Any:
    """Random weights made on the device (normal(initializer_range), unit norms), laid out like the trainer's."""
    import jax
    import jax.numpy as jnp

    from trainer.model.qwen2 import Qwen2
    from trainer.sharding import head_counts, param_shardings, path_str

    ids = jnp.zeros((1, 2), jnp.int32)
    shapes = jax.eval_shape(lambda: Qwen2(mconf).init(jax.random.key(0), ids, method=Qwen2.init_all))[
        "params"
    ]
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)

    def init(key: Any) -> Any:
        keys = jax.random.split(key, len(leaves))
        values = [
            jnp.ones(x.shape, x.dtype)
            if path_str(kp).endswith("/scale")
            else jax.random.normal(k, x.shape, x.dtype) * mconf.initializer_range
            for k, (kp, x) in zip(keys, leaves, strict=True)
        ]
        return jax.tree_util.tree_unflatten(treedef, values)

    return jax.jit(init, out_shardings=param_shardings(shapes, mesh, head_counts(mconf)))(
        jax.random.key(seed)
    )


def prompts(cfg: Any, n: int, length: int, vocab: int) -> tuple[Any, Any, tuple[int, ...], int, str]:
    """(ids, mask, eos ids, pad id, source): GSM8K through the real tokenizer, else random full-length ids."""
    import numpy as np

    try:
        from trainer import tasks
        from trainer.tokenizer import encode_chat, eos_ids, load_tokenizer, pad_id

        tok = load_tokenizer(FIXTURES / "qwen2.5-tokenizer")
        task = tasks.get("gsm8k")
        examples = task.examples(cfg)[:n]
        ids, mask = encode_chat(tok, [task.messages(ex) for ex in examples], [length])
        return ids, mask, eos_ids(tok), pad_id(tok), "gsm8k (tests/fixtures/data), real tokenizer"
    except Exception as e:
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        ids = np.random.default_rng(0).integers(0, min(vocab, 151643), size=(n, length)).astype(np.int32)
        return ids, np.ones_like(ids), (151645, 151643), 151643, f"random full-length ids ({why})"


def update_batch(
    ids_NP: Any, mask_NP: Any, comp_NC: Any, cmask_NC: Any, old_NC: Any, adv_N: Any
) -> dict[str, Any]:
    """The update's batch as trainer/loop/update.py builds it from a rollout."""
    import numpy as np

    full_ids = np.concatenate([ids_NP, comp_NC], axis=1)
    full_mask = np.concatenate([mask_NP, cmask_NC], axis=1)
    return {
        "ids": full_ids, "mask": full_mask, "pos": np.maximum(np.cumsum(full_mask, axis=1) - 1, 0).astype(np.int32),
        "comp": comp_NC, "comp_mask": cmask_NC, "old_logp": old_NC.astype(np.float32), "adv": adv_N.astype(np.float32),
    }  # fmt: skip


def xla_cost(compiled: Any) -> dict[str, float | str]:
    """XLA's own cost analysis of a compiled program (a loop body, here the micro-batch scan's, counted once)."""
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        return {
            "flops": float(cost.get("flops", 0.0)),
            "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        }
    except Exception as e:  # informative only
        return {"error": f"{type(e).__name__}"}


def another_step_fits(steps: list[dict[str, float]], now: float, deadline: float) -> bool:
    """Whether to time one more step before the size's deadline. The first timed step is always tried: the warm-up
    step's time holds the compiles (tens of seconds) and says nothing of a step's, and a size without a timed step
    has no result either way (the parent's cap stops an overrun). After it: when 1.2x the last step and 5 s fit."""
    return not steps or now + 1.2 * (steps[-1]["step_s"] + steps[-1]["prefill_s"]) + 5 <= deadline


def summarize_trace(trace_dir: Path, tokens: int, top: int = 30) -> dict[str, Any]:
    """Device kernels of a perfetto trace (jax.profiler), summed by name: total ms, count, ms per token."""
    files = sorted(trace_dir.rglob("*.trace.json.gz")) + sorted(trace_dir.rglob("perfetto_trace.json.gz"))
    if not files:
        return {"error": f"no trace file under {trace_dir}"}
    with gzip.open(files[0], "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    pname: dict[Any, str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pname[e.get("pid")] = str(e.get("args", {}).get("name", ""))
    by_proc: dict[str, float] = defaultdict(float)
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        proc = pname.get(e.get("pid"), str(e.get("pid")))
        by_proc[proc] += float(e["dur"])
        if "GPU" in proc or "gpu" in proc:
            k = kernels[str(e.get("name", "?"))[:120]]
            k[0] += float(e["dur"])
            k[1] += 1
    total = sum(v[0] for v in kernels.values())
    rows = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "file": files[0].name,
        "processes_ms": {k: round(v / 1e3, 1) for k, v in sorted(by_proc.items(), key=lambda kv: -kv[1])[:8]},
        "device_kernel_ms": round(total / 1e3, 1),
        "kernel_launches": int(sum(v[1] for v in kernels.values())),
        "launches_per_token": round(sum(v[1] for v in kernels.values()) / max(tokens, 1), 1),
        "top": [
            {
                "name": n,
                "ms": round(v[0] / 1e3, 2),
                "count": int(v[1]),
                "share": round(v[0] / max(total, 1), 3),
            }
            for n, v in rows
        ],
    }
