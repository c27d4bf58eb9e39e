"""The setup phase: start-up, model, task, optimizer, jitted programs, W&B and a resume -> (Run, State)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from trainer import checkpoint, data, metrics, profiling, tasks
from trainer.config import Config
from trainer.kernels import resolve_impl
from trainer.layout import decode_layout, init_opt_state
from trainer.loop.programs import make_ref_logp, optimizer
from trainer.loop.remat import device_bytes, update_program
from trainer.loop.state import Run, State
from trainer.loop.stop import StopNotice
from trainer.sampling.sampler import for_rollout
from trainer.sharding import batch_devices
from trainer.startup import load_model, start_up
from trainer.tokenizer import eos_ids, pad_id


def setup(cfg: Config, emit: metrics.Emitter | None) -> tuple[Run, State]:
    """Everything before step 0; a config that cannot run here (mesh, batch) is a ConfigError."""
    emit, mesh, process_index, process_count = start_up(cfg, emit)
    cfg.check_batch(process_count, batch_devices(mesh))
    emit.batch(cfg.batch_line(batch_devices(mesh)))
    profiling.start_server(cfg, emit)
    wandb_run = init_wandb(cfg, emit)
    mconf, params, tokenizer = load_model(cfg, mesh, process_index)
    task = tasks.get(cfg.data.task)
    stream = data.PromptStream(task.examples(cfg), cfg.train.seed)
    target_ids = task.token_targets(cfg, params, mconf, mesh) if task.token_targets else None
    opt = optimizer(cfg)
    # Moments split like their parameters and scalars (step counts) replicated from the start, as update()
    # returns them: else step 1 would see other input shardings and compile the update a second time.
    opt_state = init_opt_state(opt, params, mesh)(params)
    ref_params = jax.tree_util.tree_map(jnp.copy, params) if cfg.loss.beta > 0 else None
    r = cfg.rollout
    rmesh, to_decode = decode_layout(mesh, mconf, params, r.tp)
    impl = resolve_impl(cfg.train.loss_impl, jax.default_backend())
    P_len = max(cfg.data.prompt_buckets)
    run = Run(
        cfg=cfg, emit=emit, mesh=mesh, rmesh=rmesh, to_decode=to_decode, mconf=mconf, tokenizer=tokenizer,
        task=task, weights=task.weights(cfg), target_ids=target_ids,
        sampling=for_rollout(r, jax.default_backend()),
        eos=eos_ids(tokenizer), pad=pad_id(tokenizer), impl=impl,
        updates={P_len: update_program(cfg, mconf, P_len, impl, (params, opt_state),
                                       resident_bytes=device_bytes(ref_params), say=emit.line)},
        ref_params=ref_params, ref_logp=make_ref_logp(cfg, mconf, impl, mesh) if ref_params is not None else None,
        ckpt=checkpoint.manager(cfg.checkpoint.dir) if cfg.checkpoint.dir else None,
        notice=StopNotice(process_count), wandb_run=wandb_run,
    )  # fmt: skip
    return run, resume(run, State(params, opt_state, stream, start=0))


def resume(run: Run, state: State) -> State:
    """`state` from the latest checkpoint in checkpoint.dir (checkpoint.resume), else as it is."""
    cfg, emit = run.cfg, run.emit
    if run.ckpt is None and cfg.checkpoint.every:
        emit.line(
            f"warning: checkpoint.every={cfg.checkpoint.every} but checkpoint.dir is empty: no checkpoint will be "
            "written, and a stopped or preempted run starts again from step 0 (set checkpoint.dir=gs://BUCKET/PATH)"
        )
    if run.ckpt is None or not cfg.checkpoint.resume:
        return state
    got = checkpoint.restore_latest(run.ckpt, {"params": state.params, "opt_state": state.opt_state})
    if got is None:
        return state
    start, saved, meta = got
    state.params, state.opt_state, state.start = saved["params"], saved["opt_state"], start
    state.stream.position = int(meta["data_position"])
    emit.line(f"resumed step={start} from={cfg.checkpoint.dir}")
    return state


def init_wandb(cfg: Config, emit: metrics.Emitter) -> Any:
    """W&B per log.wandb; an init failure stops the run unless log.wandb_required is false."""
    if cfg.log.wandb == "disabled" or not emit.is_main:
        emit.line("wandb: disabled")
        return None
    try:
        import wandb

        from trainer.config import to_dict

        out = Path(cfg.log.output_dir).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        run = wandb.init(project=cfg.log.project, config=to_dict(cfg), mode=cfg.log.wandb, dir=str(out))
    except Exception as e:
        emit.line(f"wandb: ERROR init failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        if cfg.log.wandb_required:
            raise SystemExit(
                "wandb init failed and log.wandb_required is true (set log.wandb=disabled to run without)"
            ) from None
        return None
    emit.wandb = run
    emit.line(
        f"wandb: url={run.url}"
        if cfg.log.wandb == "online" and run.url
        else f"wandb: mode={cfg.log.wandb} dir={run.dir}"
    )
    return run
