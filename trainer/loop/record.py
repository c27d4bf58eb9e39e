"""The record phase: the step line, checkpoints, a SIGTERM stop and evals; the summary at the end."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from trainer import checkpoint, chips, compile_cache, metrics
from trainer.distributed import to_host
from trainer.eval import evaluate
from trainer.loop.state import Rollout, Run, Scores, State


def step_row(
    state: State, ro: Rollout, sc: Scores, stats: dict[str, float], t_update: float
) -> dict[str, Any]:
    """The step line's values (metrics.format_step orders them); `dt` is the whole step up to now."""
    dt = time.perf_counter() - ro.t0
    lens = ro.cmask_NC.sum(axis=1)
    reward = float(sc.total_N.mean())
    h = state.history
    return {
        "reward_mean": reward, "reward_delta": reward - h[-1]["reward_mean"] if h else 0.0,
        **({"kl": stats["kl"]} if "kl" in stats else {}), "kl_old": stats["kl_old"],
        "clip_frac": stats["clip_low_frac"] + stats["clip_high_frac"], "grad_norm": stats["grad_norm"],
        "entropy": stats["entropy"], "tokens_per_s": float(lens.sum() / max(ro.seconds, 1e-9)), "dt": dt,
        "rollout_generate": ro.seconds, "update": t_update, "reward_score": sc.seconds, "loss": stats["loss"],
        "completion_len_mean": float(lens.mean()), "completion_len_max": int(lens.max()),
        "clip_low_frac": stats["clip_low_frac"], "clip_high_frac": stats["clip_high_frac"],
        **{f"reward_{k}": v for k, v in sc.per_name.items()},
    }  # fmt: skip


def record(run: Run, state: State, step: int, row: dict[str, Any]) -> None:
    """Emit the step line; checkpoint (every checkpoint.every, at the end, on a stop); stop with exit 143 after
    SIGTERM; evaluate every eval.every steps."""
    cfg, emit = run.cfg, run.emit
    chip = chips.sample(jax.local_devices())  # {} on CPU: the step line has no chip fields there
    emit.step(step, {**row, **chip})
    emit.chips(step, jax.process_index(), chip)
    state.history.append(row)
    done = step + 1
    stopping = run.notice.reached(done) and done < cfg.train.steps
    every = cfg.checkpoint.every
    if run.ckpt is not None and (stopping or done == cfg.train.steps or (every and done % every == 0)):
        meta = {"data_position": state.stream.position}
        checkpoint.save(run.ckpt, done, {"params": state.params, "opt_state": state.opt_state}, meta)
        emit.checkpoint(done, str(cfg.checkpoint.dir))
    if stopping:
        run.notice.close()
        kept = (
            "checkpoint saved" if run.ckpt is not None else "no checkpoint.dir: this run's progress is lost"
        )
        emit.line(f"stopped: SIGTERM ({stop_cause()}) after step={done}; {kept}")
        if run.wandb_run is not None:
            run.wandb_run.finish(exit_code=143)
        raise SystemExit(143)
    if cfg.eval.every and done % cfg.eval.every == 0:
        evaluate(cfg, state.params, run.mconf, run.tokenizer, run.mesh, emit, step=done)


def stop_cause() -> str:
    """Why SIGTERM came: the VM's notice when tpuops' watcher wrote it (TPUOPS_NOTICE_FILE holds
    `instance/preempted=TRUE`, docs/contracts.md), else either."""
    path = os.environ.get("TPUOPS_NOTICE_FILE", "")
    try:
        if path:
            return f"preemption notice: {Path(path).read_text()[:200].strip()}"
    except OSError:
        pass
    return "preemption notice or tpuops stop"


def finish(run: Run, state: State) -> dict[str, Any]:
    """The `summary:` line (and W&B's end); returns the summary with the final "params"."""
    run.notice.close()
    out = summary(state.history, state.start)
    # Jitted: one program, where eagerly each op on each leaf compiled one of its own in every new process.
    out["param_norm"] = float(jax.jit(optax.global_norm)(state.params))
    if run.cfg.log.param_digest:
        out["param_digest"] = param_digest(state.params)
    out.update(compile_cache.COUNTER.summary())
    run.emit.summary(out)
    if run.wandb_run is not None:
        run.wandb_run.finish()
    return {**out, "params": state.params}


def summary(history: list[dict[str, Any]], start: int) -> dict[str, Any]:
    """The run's figures from its step rows; `dt_p50` as the contract defines it (metrics.steady_dt_p50)."""
    if not history:
        return {"steps": 0, "start_step": start}
    first, last = history[0], history[-1]
    return {
        "steps": len(history), "start_step": start, "reward_mean_first": first["reward_mean"],
        "reward_mean_last": last["reward_mean"], "reward_mean_change": last["reward_mean"] - first["reward_mean"],
        "loss_last": last["loss"], "dt_p50": metrics.steady_dt_p50([h["dt"] for h in history]),
        "rollout_generate_mean": float(np.mean([h["rollout_generate"] for h in history])),
        "update_mean": float(np.mean([h["update"] for h in history])),
    }  # fmt: skip


def param_digest(params: Any) -> str:
    """sha256 (16 hex digits) of the parameters' bytes, leaves in tree order: equal digests = equal parameters.

    Gathers every parameter to the host: for tests and small models (log.param_digest).
    """
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(params):
        h.update(np.ascontiguousarray(to_host(leaf)).tobytes())
    return h.hexdigest()[:16]
