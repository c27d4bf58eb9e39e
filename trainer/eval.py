"""Test accuracy (pass@1) on the task's eval split (GSM8K test): `evaluate()` in a run, `python -m trainer.eval`.

Dims: B eval batch (eval.batch rounded up to a multiple of the batch devices), P the largest prompt bucket,
C = rollout.max_new_tokens. Every batch has the same shape [B, P] (the last one is filled with repeats of
its final prompt, whose completions are ignored), so the sampler compiles once per run, and every compile
of an evaluation happens between its `eval_begin` and `eval_end` lines (tpuops counts those as eval, not as
training recompiles). Each process generates the same global batch; the answers are gathered to all.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainer import config as config_mod
from trainer import metrics, tasks
from trainer.config import Config, ConfigError
from trainer.grpo.rewards import Sample, score


def score_completions(texts: Sequence[str], golds: Sequence[str | None]) -> np.ndarray:
    """1.0 for each completion whose final answer equals its gold answer (rewards.correctness), else 0.0.

    A check that raises counts as wrong (training scores it −1; an accuracy has no room for that)."""
    if len(texts) != len(golds):
        raise ValueError(f"{len(texts)} completions but {len(golds)} gold answers")
    got = score([Sample(t, g) for t, g in zip(texts, golds, strict=True)], {"correctness": 1.0})
    return np.maximum(got.total_N, 0.0)


def eval_batch_size(cfg: Config, batch_devices: int) -> int:
    """eval.batch rounded up to a multiple of the devices the batch is split over (dp × fsdp)."""
    return -(-cfg.eval.batch // batch_devices) * batch_devices


def eval_task(cfg: Config) -> tasks.Task:
    """The config's task, which must declare an eval split (a ConfigError otherwise)."""
    task = tasks.get(cfg.data.task)
    if task.eval_examples is None:
        with_eval = ", ".join(t.name for t in tasks.TASKS.values() if t.eval_examples is not None)
        raise ConfigError(f"data.task={task.name} has no eval split (tasks with one: {with_eval})")
    return task


def prompt_rows(cfg: Config, tokenizer: Any) -> tuple[list[list[int]], list[str | None], int]:
    """(token rows, gold answers, skipped): the first eval.max_examples questions of the task's eval split (0:
    all) as chat prompts; those longer than the largest prompt bucket are skipped and counted."""
    from trainer.tokenizer import chat_text

    task = eval_task(cfg)
    assert task.eval_examples is not None  # eval_task refuses a task without an eval split
    examples = task.eval_examples(cfg)
    if cfg.eval.max_examples:
        examples = examples[: cfg.eval.max_examples]
    limit = max(cfg.data.prompt_buckets)
    rows, golds, skipped = [], [], 0
    for ex in examples:
        text = chat_text(tokenizer, task.messages(ex))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > limit:
            skipped += 1
            continue
        rows.append(ids)
        golds.append(ex.gold)
    if not rows:
        raise ConfigError(
            f"no {task.name} eval prompt fits data.prompt_buckets (largest {limit} tokens); raise it (gsm8k: 256)"
        )
    return rows, golds, skipped


def evaluate(
    cfg: Config, params: Any, mconf: Any, tokenizer: Any, mesh: Any, emit: metrics.Emitter, *, step: int = 0
) -> float:
    """Accuracy on the task's eval split (greedy or sampled per eval.greedy); emits the three eval lines."""
    import jax

    from trainer.distributed import global_array, to_host
    from trainer.sampling.sampler import for_rollout, generate
    from trainer.sharding import batch_devices
    from trainer.tokenizer import decode, eos_ids, pad_batch, pad_id

    emit.eval_begin(step)
    t0 = time.perf_counter()
    rows, golds, skipped = prompt_rows(cfg, tokenizer)
    if skipped:
        emit.line(
            f"warning: eval skipped {skipped} test prompts longer than {max(cfg.data.prompt_buckets)} tokens"
        )
    B = eval_batch_size(cfg, batch_devices(mesh))
    P_len = max(cfg.data.prompt_buckets)
    r = cfg.rollout
    sampling = for_rollout(r, jax.default_backend(), greedy=cfg.eval.greedy)
    eos, pad = eos_ids(tokenizer), pad_id(tokenizer)
    # A stream of its own (not the rollouts'): sampled evals at the same step draw the same completions.
    key = jax.random.fold_in(jax.random.key(cfg.train.seed + 1), step)
    correct = []
    for start in range(0, len(rows), B):
        chunk = rows[start : start + B]
        real = len(chunk)
        ids_BP, mask_BP = pad_batch(chunk + [chunk[-1]] * (B - real), P_len, pad, side="left")
        out = generate(
            params,
            mconf,
            global_array(mesh, ids_BP),
            global_array(mesh, mask_BP),
            jax.random.fold_in(key, start),
            sampling,
            eos,
            pad,
            mesh=mesh,
        )
        comp_BC, cmask_BC = to_host(out.completion_ids_BC), to_host(out.completion_mask_BC)
        texts = decode(tokenizer, comp_BC[:real], cmask_BC[:real])
        correct.append(score_completions(texts, golds[start : start + real]))
    hits = np.concatenate(correct)
    accuracy = float(hits.mean())
    emit.eval_result(step, accuracy, len(hits), time.perf_counter() - t0)
    emit.eval_end(step)
    return accuracy


def run(cfg: Config, checkpoint_dir: str | None = None, emit: metrics.Emitter | None = None) -> float:
    """Load the model as train.run does (and the latest checkpoint's params if given), evaluate once."""
    from trainer import checkpoint
    from trainer.startup import load_model, start_up

    eval_task(cfg)  # before minutes of loading: fail in seconds
    emit, mesh, process_index, _ = start_up(cfg, emit)
    mconf, params, tokenizer = load_model(cfg, mesh, process_index)
    step = 0
    if checkpoint_dir:
        step, params = restore_params(checkpoint.manager(checkpoint_dir), params, checkpoint_dir)
        emit.line(f"restored step={step} from={checkpoint_dir}")
    return evaluate(cfg, params, mconf, tokenizer, mesh, emit, step=step)


def restore_params(mgr: Any, like: Any, where: str) -> tuple[int, Any]:
    """(step, params) of the latest checkpoint, placed like `like`; the optimizer state is not read."""
    import jax
    import orbax.checkpoint as ocp

    step = mgr.latest_step()
    if step is None:
        raise ConfigError(f"--checkpoint {where}: no checkpoint in it (a checkpoint.dir of a training run)")
    abstract = {
        "params": jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like
        )
    }
    got = mgr.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(
                item=abstract,
                restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
                partial_restore=True,
            )
        ),
    )
    return step, got["state"]["params"]


def main(argv: list[str] | None = None) -> int:
    """CLI entry: 0 evaluated, 2 bad config, override or checkpoint folder."""
    ap = argparse.ArgumentParser(prog="python -m trainer.eval", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--config", default="tiny", help=f"preset ({', '.join(config_mod.presets())}) or a YAML path"
    )
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. eval.max_examples=100"
    )
    ap.add_argument(
        "--checkpoint", metavar="DIR", help="restore params from the latest orbax checkpoint in DIR"
    )
    args = ap.parse_args(argv)
    try:
        cfg = config_mod.load(args.config, args.set)
        ckpt = args.checkpoint
        if ckpt and not ckpt.startswith("gs://") and not Path(ckpt).expanduser().is_dir():
            raise ConfigError(f"--checkpoint {ckpt}: no such folder (pass a training run's checkpoint.dir)")
        run(cfg, ckpt)
    except ConfigError as e:
        print(f"config: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
