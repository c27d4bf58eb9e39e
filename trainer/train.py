"""The GRPO loop: sample G completions per prompt, score, group-relative advantages, one jitted update.

Dims: N sequences per step (prompts × G), P prompt bucket, C = rollout.max_new_tokens, S = P + C, D hidden.
"""

from __future__ import annotations

import hashlib
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from trainer import checkpoint, data, distributed, metrics, tasks
from trainer.config import Config, ConfigError, dumps
from trainer.grpo.advantages import group_advantages
from trainer.grpo.loss import grpo_objective
from trainer.grpo.rewards import Sample, score
from trainer.kernels import resolve_impl, token_logprob_entropy_from_hidden
from trainer.layout import OnMesh, decode_layout, init_opt_state
from trainer.model.qwen2 import forward_hidden, lm_head_weight
from trainer.sampling.sampler import SamplingConfig, generate
from trainer.sharding import make_mesh
from trainer.tokenizer import chat_text, encode_chat, eos_ids, load_tokenizer, pad_id

BATCH = ("dp", "fsdp")  # mesh axes the sequence dimension is split over


@dataclass
class Policy:
    """Everything fixed for the run: model config, tokenizer, mesh, jitted update."""

    mconf: Any
    tokenizer: Any
    mesh: Mesh
    update: Any
    ref_logp: Any


def setup_jax(cfg: Config) -> None:
    if cfg.log.log_compiles:
        jax.config.update("jax_log_compiles", True)
        jax.config.update("jax_explain_cache_misses", True)


def tiny_folder(cfg: Config, process_index: int) -> Path:
    """Where the `tiny` checkpoint of this config lives under log.output_dir (one folder per process)."""
    from trainer.make_tokenizer import BUNDLED

    tok = cfg.model.tokenizer
    # The bundled tokenizer's content is in the name, so a changed tokenizer.json never meets an old model.
    name = {
        "qwen2.5": "qwen2.5",
        "bundled": "bundled-" + hashlib.sha256((BUNDLED / "tokenizer.json").read_bytes()).hexdigest()[:8],
    }.get(tok) or "tok-" + hashlib.sha256(tok.encode()).hexdigest()[:8]
    return (
        Path(cfg.log.output_dir).expanduser()
        / f"tiny-{cfg.model.preset}-{name}-seed{cfg.model.seed}-p{process_index}"
    )


def model_folder(cfg: Config, process_index: int) -> Path:
    """The local folder of the checkpoint (weights and tokenizer): `tiny` is made (seeded, with
    model.tokenizer) on first use under log.output_dir; a hub id is downloaded (or found in the HF cache); a
    folder is used as it is. A cached tiny folder is trusted only when complete (make_tiny writes it under a
    temporary name and renames it into place); anything else there is rebuilt."""
    if cfg.model.path != "tiny":
        from trainer.model.loading import resolve_path

        return resolve_path(cfg.model.path)
    from trainer.make_tiny import complete, make_tiny

    out = tiny_folder(cfg, process_index)
    if not complete(out):
        make_tiny(
            out, cfg.model.preset, cfg.model.seed, tokenizer=cfg.model.tokenizer, data_root=cfg.data.root
        )
    return out


def optimizer(cfg: Config) -> optax.GradientTransformation:
    t = cfg.train
    schedule = optax.warmup_cosine_decay_schedule(
        0.0 if t.warmup_steps else t.learning_rate,
        t.learning_rate,
        max(t.warmup_steps, 1),
        max(t.steps, 2),
        0.1 * t.learning_rate,
    )
    if t.optimizer == "lion":
        opt = optax.lion(schedule, weight_decay=t.weight_decay)
    else:
        opt = optax.adamw(schedule, weight_decay=t.weight_decay)
    return optax.chain(optax.clip_by_global_norm(t.max_grad_norm), opt)


def make_loss_fn(cfg: Config, mconf: Any, P_len: int, impl: str) -> Any:
    """loss_fn(params, micro_batch, dapo_tokens) -> (loss, aux): the GRPO objective of one micro-batch."""
    C = cfg.rollout.max_new_tokens
    temperature = cfg.rollout.temperature

    def loss_fn(params: Any, mb: dict[str, jax.Array], dapo_tokens: jax.Array) -> tuple[jax.Array, Any]:
        hidden_BSD = forward_hidden(params, mconf, mb["ids"], mb["pos"], mb["mask"])
        h_BCD = hidden_BSD[:, P_len - 1 : P_len - 1 + C]  # position t predicts token t + 1
        logp_BC, ent_BC = token_logprob_entropy_from_hidden(
            h_BCD, lm_head_weight(params, mconf), mb["comp"], temperature=temperature, impl=impl
        )
        ref = mb.get("ref_logp") if cfg.loss.beta > 0 else None
        return grpo_objective(
            logp_BC,
            mb["old_logp"],
            ref,
            mb["adv"],
            mb["comp_mask"],
            ent_BC,
            cfg.loss,
            dapo_tokens=dapo_tokens,
        )

    return loss_fn


def make_update(
    cfg: Config, mconf: Any, opt: optax.GradientTransformation, P_len: int, impl: str, like: tuple[Any, Any]
) -> OnMesh:
    """One jitted step: mean of the micro-batch gradients (lax.scan), applied once; traced on the params' mesh
    with each decoder layer rematerialised per train.remat.

    Outputs keep the inputs' shardings (`like` = (params, opt_state)): if XLA chose its own, the next step's
    inputs would differ and the update would compile again.
    """
    n_micro = cfg.accumulation_steps
    loss_fn = make_loss_fn(cfg, mconf.replace(remat=cfg.train.remat), P_len, impl)

    def update(
        params: Any, opt_state: Any, batch: dict[str, jax.Array]
    ) -> tuple[Any, Any, dict[str, jax.Array]]:
        dapo_tokens = batch["comp_mask"].sum().astype(jnp.float32) / n_micro
        micro = jax.tree_util.tree_map(lambda x: x.reshape(n_micro, -1, *x.shape[1:]), batch)
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)

        def body(acc: Any, mb: dict[str, jax.Array]) -> tuple[Any, Any]:
            (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb, dapo_tokens)
            return jax.tree_util.tree_map(jnp.add, acc, grads), (loss, aux)

        grads, (losses, auxes) = jax.lax.scan(body, zeros, micro)
        grads = jax.tree_util.tree_map(lambda g: g / n_micro, grads)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        out = {"loss": losses.mean(), "grad_norm": optax.global_norm(grads)}
        out.update({k: v.mean() for k, v in auxes.items()})
        return params, opt_state, out

    shardings = jax.tree_util.tree_map(lambda x: x.sharding, like)
    mesh = jax.tree_util.tree_leaves(shardings)[0].mesh
    return OnMesh(jax.jit(update, donate_argnums=(0, 1), out_shardings=(*shardings, None)), mesh)


def global_array(mesh: Mesh, host: np.ndarray) -> jax.Array:
    """A batch-sharded global array from data every process holds in full (each places only its shards)."""
    spec = P(BATCH, *([None] * (host.ndim - 1)))
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def to_host(x: jax.Array) -> np.ndarray:
    if jax.process_count() == 1:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def draw_prompts(stream: data.PromptStream, tokenizer: Any, cfg: Config, n: int) -> list[data.Example]:
    """n examples whose chat prompt fits the largest bucket (longer ones are skipped, the same on every process)."""
    limit = max(cfg.data.prompt_buckets)
    out: list[data.Example] = []
    tried = 0
    while len(out) < n:
        ex = stream.next_global(1)[0]
        tried += 1
        if tried > len(stream.examples) and not out:
            raise SystemExit(f"config: no prompt fits data.prompt_buckets (largest {limit} tokens); raise it")
        text = chat_text(tokenizer, tasks.get(cfg.data.task).messages(ex))
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= limit:
            out.append(ex)
    return out


class StopNotice:
    """SIGTERM (a preemption notice, `tpuops stop`) ends the run at a step boundary, after a checkpoint.

    Multi-host: JAX's preemption service catches SIGTERM and every process agrees on the step to stop at
    (multihost_utils.reached_preemption_sync_point, asked after every step). One process: a handler sets a flag.
    """

    def __init__(self, process_count: int) -> None:
        self.multi = process_count > 1
        self.flag = False
        self.previous: Any = None
        if not self.multi and threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._on_term)

    def close(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None

    def _on_term(self, signum: int, frame: Any) -> None:
        self.flag = True

    def reached(self, done: int) -> bool:
        if not self.multi:
            return self.flag
        from jax.experimental import multihost_utils

        try:
            return multihost_utils.reached_preemption_sync_point(done)
        except RuntimeError:  # the preemption service is off (jax_enable_preemption_service)
            return False


def start_up(cfg: Config, emit: metrics.Emitter | None) -> tuple[metrics.Emitter, Mesh, int, int]:
    """Training's and eval's start-up: JAX settings, the multi-host join, the mesh, the `start:` and `config:`
    lines. Returns (emitter, mesh, process_index, process_count); a mesh that does not fit is a ConfigError."""
    setup_jax(cfg)
    process_index, process_count = distributed.init()
    emit = emit or metrics.Emitter(process_index)
    devices = jax.devices()[: cfg.mesh.devices or None]
    fsdp = cfg.mesh.fsdp or len(devices) // (cfg.mesh.dp * cfg.mesh.tp)
    try:
        mesh = make_mesh(cfg.mesh.dp, fsdp, cfg.mesh.tp, devices)
    except ValueError as e:
        raise ConfigError(f"mesh: {e}") from None
    emit.start(
        backend=jax.default_backend(), process_count=process_count, process_index=process_index,
        device_count=len(devices), mesh=f"dp:{cfg.mesh.dp},fsdp:{fsdp},tp:{cfg.mesh.tp}",
    )  # fmt: skip
    emit.config(dumps(cfg))
    return emit, mesh, process_index, process_count


def toy_targets(params: Any, mconf: Any, mesh: Mesh, fraction: float, seed: int) -> frozenset[int]:
    """The toy task's hit tokens: the `fraction` of the vocabulary whose output embedding points furthest along
    a seeded random direction of the hidden space, so one direction of the final hidden state reaches them all.
    (A set fixed by id, like the first quarter, is not learnable: random embeddings carry no id order.)
    """
    w_DV = lm_head_weight(params, mconf)
    d_D = jax.random.normal(jax.random.key(seed + 10_007), (w_DV.shape[0],), jnp.float32)
    proj = jax.jit(lambda w: d_D @ w.astype(jnp.float32), out_shardings=NamedSharding(mesh, P()))(w_DV)
    k = int(fraction * w_DV.shape[1])
    return frozenset(np.argsort(-np.asarray(proj), kind="stable")[:k].tolist())


def run(cfg: Config, emit: metrics.Emitter | None = None) -> dict[str, Any]:
    """Train; returns the summary (also printed as `summary: {json}`)."""
    try:
        emit, mesh, process_index, process_count = start_up(cfg, emit)
        fsdp = mesh.shape["fsdp"]
        cfg.check_batch(process_count, cfg.mesh.dp * fsdp)
    except ConfigError as e:
        raise SystemExit(f"config: {e}") from None
    emit.batch(cfg.batch_line(cfg.mesh.dp * fsdp))
    wandb_run = init_wandb(cfg, emit)

    folder = model_folder(cfg, process_index)
    from trainer.model.loading import load_pretrained

    mconf, params = load_pretrained(folder, mesh=mesh, dtype=cfg.model.dtype)
    tok_dir = folder if cfg.data.tokenizer == "auto" else Path(cfg.data.tokenizer)
    tokenizer = load_tokenizer(tok_dir)
    task = tasks.get(cfg.data.task)
    stream = data.PromptStream(task.examples(cfg), cfg.train.seed)
    target_ids = (
        toy_targets(params, mconf, mesh, cfg.data.toy_fraction, cfg.train.seed)
        if task.token_targets
        else None
    )
    weights = task.weights(cfg)

    opt = optimizer(cfg)
    # Moments split like their parameters and scalars (step counts) replicated from the start, as update()
    # returns them: else step 1 would see other input shardings and compile the update a second time.
    opt_state = init_opt_state(opt, params, mesh)(params)
    ref_params = jax.tree_util.tree_map(jnp.copy, params) if cfg.loss.beta > 0 else None
    sampling = SamplingConfig(
        cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_k, cfg.rollout.top_p
    )
    eos, pad = eos_ids(tokenizer), pad_id(tokenizer)
    rmesh, to_decode = decode_layout(mesh, mconf, params, cfg.rollout.tp)
    impl = resolve_impl(cfg.train.loss_impl, jax.default_backend())
    P_len = max(cfg.data.prompt_buckets)
    updates = {P_len: make_update(cfg, mconf, opt, P_len, impl, (params, opt_state))}
    ref_logp_fn = (
        OnMesh(jax.jit(lambda p, b, n: _ref_logp(p, b, mconf, n, cfg, impl), static_argnums=2), mesh)
        if ref_params is not None
        else None
    )

    start = 0
    mgr = checkpoint.manager(cfg.checkpoint.dir) if cfg.checkpoint.dir else None
    if mgr is None and cfg.checkpoint.every:
        emit.line(
            f"warning: checkpoint.every={cfg.checkpoint.every} but checkpoint.dir is empty: no checkpoint will be "
            "written, and a stopped or preempted run starts again from step 0 (set checkpoint.dir=gs://BUCKET/PATH)"
        )
    if mgr is not None and cfg.checkpoint.resume:
        got = checkpoint.restore_latest(mgr, {"params": params, "opt_state": opt_state})
        if got is not None:
            start, state, meta = got
            params, opt_state = state["params"], state["opt_state"]
            stream.position = int(meta["data_position"])
            emit.line(f"resumed step={start} from={cfg.checkpoint.dir}")
    notice = StopNotice(process_count)
    base_key = jax.random.key(cfg.train.seed)
    G = cfg.rollout.samples_per_prompt
    history: list[dict[str, float]] = []
    for step in range(start, cfg.train.steps):
        t0 = time.perf_counter()
        prompts = draw_prompts(stream, tokenizer, cfg, cfg.train.prompts_per_step)
        buckets = [P_len] if cfg.data.fixed_bucket else cfg.data.prompt_buckets
        ids_PP, mask_PP = encode_chat(tokenizer, [task.messages(ex) for ex in prompts], buckets)
        p_len = ids_PP.shape[1]
        if p_len not in updates:
            updates[p_len] = make_update(cfg, mconf, opt, p_len, impl, (params, opt_state))
        update = updates[p_len]
        ids_NP, mask_NP = np.repeat(ids_PP, G, axis=0), np.repeat(mask_PP, G, axis=0)
        rng = jax.random.fold_in(base_key, step)
        rparams = to_decode(params)
        out = generate(
            rparams, mconf, global_array(rmesh, ids_NP), global_array(rmesh, mask_NP), rng, sampling, eos, pad,
            mesh=rmesh,
        )  # fmt: skip
        del rparams
        comp_NC, cmask_NC, old_NC = (
            to_host(out.completion_ids_BC),
            to_host(out.completion_mask_BC),
            to_host(out.logprobs_BC),
        )
        t_roll = time.perf_counter() - t0

        texts = tokenizer.batch_decode(
            [row[m.astype(bool)] for row, m in zip(comp_NC, cmask_NC, strict=True)], skip_special_tokens=True
        )
        samples = [
            Sample(
                text,
                prompts[i // G].gold,
                tuple(int(t) for t in comp_NC[i][cmask_NC[i].astype(bool)]),
                target_ids,
            )
            for i, text in enumerate(texts)
        ]
        scores = score(samples, weights)
        for name, count in scores.errors.items():
            emit.reward_errors(step, name, count)
        adv_N = np.asarray(group_advantages(jnp.asarray(scores.total_N), G, cfg.loss.scale_rewards))
        if cfg.train.flip_advantages:
            adv_N = -adv_N
        t_reward = time.perf_counter() - t0 - t_roll

        full_ids = np.concatenate([ids_NP, comp_NC], axis=1)
        full_mask = np.concatenate([mask_NP, cmask_NC], axis=1)
        batch = {
            "ids": full_ids, "mask": full_mask, "pos": np.maximum(np.cumsum(full_mask, axis=1) - 1, 0).astype(np.int32),
            "comp": comp_NC, "comp_mask": cmask_NC, "old_logp": old_NC.astype(np.float32), "adv": adv_N.astype(np.float32),
        }  # fmt: skip
        gbatch = {k: global_array(mesh, np.asarray(v)) for k, v in batch.items()}
        if ref_logp_fn is not None:
            gbatch["ref_logp"] = ref_logp_fn(ref_params, gbatch, p_len)
        t1 = time.perf_counter()
        for _ in range(cfg.train.ppo_epochs):
            params, opt_state, stats = update(params, opt_state, gbatch)
        stats = {k: float(v) for k, v in stats.items()}
        t_update = time.perf_counter() - t1
        dt = time.perf_counter() - t0
        lens = cmask_NC.sum(axis=1)
        reward = float(scores.total_N.mean())
        row = {
            "reward_mean": reward, "reward_delta": reward - history[-1]["reward_mean"] if history else 0.0,
            **({"kl": stats["kl"]} if "kl" in stats else {}), "kl_old": stats["kl_old"],
            "clip_frac": stats["clip_low_frac"] + stats["clip_high_frac"], "grad_norm": stats["grad_norm"],
            "entropy": stats["entropy"], "tokens_per_s": float(lens.sum() / max(t_roll, 1e-9)), "dt": dt,
            "rollout_generate": t_roll, "update": t_update, "reward_score": t_reward, "loss": stats["loss"],
            "completion_len_mean": float(lens.mean()), "completion_len_max": int(lens.max()),
            "clip_low_frac": stats["clip_low_frac"], "clip_high_frac": stats["clip_high_frac"],
            **{f"reward_{k}": v for k, v in scores.per_name.items()},
        }  # fmt: skip
        emit.step(step, row)
        history.append(row)
        done = step + 1
        stopping = notice.reached(done) and done < cfg.train.steps
        if mgr is not None and (
            stopping or done == cfg.train.steps or (cfg.checkpoint.every and done % cfg.checkpoint.every == 0)
        ):
            checkpoint.save(
                mgr, done, {"params": params, "opt_state": opt_state}, {"data_position": stream.position}
            )
            emit.checkpoint(done, str(cfg.checkpoint.dir))
        if stopping:
            notice.close()
            kept = "checkpoint saved" if mgr is not None else "no checkpoint.dir: this run's progress is lost"
            emit.line(f"stopped: SIGTERM (preemption notice or tpuops stop) after step={done}; {kept}")
            if wandb_run is not None:
                wandb_run.finish(exit_code=143)
            raise SystemExit(143)
        if cfg.eval.every and done % cfg.eval.every == 0:
            from trainer.eval import evaluate

            evaluate(cfg, params, mconf, tokenizer, mesh, emit, step=done)
    notice.close()
    summary = _summary(history, start)
    summary["param_norm"] = float(optax.global_norm(params))
    if cfg.log.param_digest:
        summary["param_digest"] = param_digest(params)
    emit.summary(summary)
    if wandb_run is not None:
        wandb_run.finish()
    return {**summary, "params": params}


def param_digest(params: Any) -> str:
    """sha256 (16 hex digits) of the parameters' bytes, leaves in tree order: equal digests = equal parameters.

    Gathers every parameter to the host: for tests and small models (log.param_digest).
    """
    import hashlib

    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(params):
        h.update(np.ascontiguousarray(to_host(leaf)).tobytes())
    return h.hexdigest()[:16]


def _ref_logp(
    params: Any, b: dict[str, jax.Array], mconf: Any, P_len: int, cfg: Config, impl: str
) -> jax.Array:
    C = cfg.rollout.max_new_tokens
    hidden = forward_hidden(params, mconf, b["ids"], b["pos"], b["mask"])[:, P_len - 1 : P_len - 1 + C]
    logp, _ = token_logprob_entropy_from_hidden(
        hidden, lm_head_weight(params, mconf), b["comp"], temperature=cfg.rollout.temperature, impl=impl
    )
    return jax.lax.stop_gradient(logp)


def _summary(history: list[dict[str, float]], start: int) -> dict[str, Any]:
    if not history:
        return {"steps": 0, "start_step": start}
    dts = sorted(h["dt"] for h in history[1:]) or [history[0]["dt"]]
    return {
        "steps": len(history), "start_step": start, "reward_mean_first": history[0]["reward_mean"],
        "reward_mean_last": history[-1]["reward_mean"],
        "reward_mean_change": history[-1]["reward_mean"] - history[0]["reward_mean"], "loss_last": history[-1]["loss"],
        "dt_p50": dts[len(dts) // 2], "rollout_generate_mean": float(np.mean([h["rollout_generate"] for h in history])),
        "update_mean": float(np.mean([h["update"] for h in history])),
    }  # fmt: skip


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
