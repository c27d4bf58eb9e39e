"""The jitted programs of a step: the optimizer, the GRPO loss of a micro-batch, the accumulated update and
the reference log-probs (trainer.fit compiles the same ones for a TPU).

Dims: B sequences of a micro-batch, S = P + C, C = rollout.max_new_tokens, D hidden, K micro-batches.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from trainer.config import Config
from trainer.grpo.loss import grpo_objective
from trainer.kernels import token_logprob_entropy_from_hidden
from trainer.layout import OnMesh
from trainer.model import flash
from trainer.model.qwen2 import forward_hidden, forward_hidden_grouped, lm_head_weight
from trainer.sharding import DCN_AXIS


def learning_rate(cfg: Config, steps: Any) -> optax.Schedule:
    """The learning rate at each optimizer step of a `steps`-step run: a linear warm-up over train.warmup_steps
    (from 0; none when 0), then a cosine decay from train.learning_rate to a tenth of it at the last step. It is
    optax.warmup_cosine_decay_schedule, with the run's length a value (the update's input) rather than a
    constant in the program: runs that differ only in train.steps (a 3-step smoke run, then the real one) share
    one compiled update and its persistent-cache entry. A run no longer than its warm-up stays at the peak after
    it (optax refuses a decay of no steps: every shipped TPU preset's `--set train.steps=3` failed there)."""
    t = cfg.train
    peak, start = t.learning_rate, (0.0 if t.warmup_steps else t.learning_rate)
    warmup = max(t.warmup_steps, 1)
    alpha = 0.1

    def schedule(count: Any) -> jax.Array:
        warm = (start - peak) * (1 - jnp.clip(count, 0, warmup) / warmup) + peak
        decay = jnp.maximum(steps, 2) - warmup
        cosine = 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum(count - warmup, decay) / jnp.maximum(decay, 1)))
        decayed = peak * ((1 - alpha) * cosine + alpha)
        return jnp.where(count < warmup, warm, jnp.where(decay > 0, decayed, peak))

    return schedule


def optimizer(cfg: Config, steps: Any = None) -> optax.GradientTransformation:
    """Clipping, then AdamW or Lion at learning_rate(cfg, steps); `steps` defaults to train.steps. Its state
    is the same whatever `steps` is: the update builds it again around its own input."""
    t = cfg.train
    schedule = learning_rate(cfg, t.steps if steps is None else steps)
    if t.optimizer == "lion":
        opt = optax.lion(schedule, weight_decay=t.weight_decay)
    else:
        opt = optax.adamw(schedule, weight_decay=t.weight_decay)
    return optax.chain(optax.clip_by_global_norm(t.max_grad_norm), opt)


def prompt_groups(cfg: Config, rows: int, P_len: int, attention: str) -> int:
    """G when the update's forward runs each prompt once for its group of G = rollout.samples_per_prompt rows
    (`train.shared_prompt`, `qwen2.forward_hidden_grouped`): `rows` (a micro-batch's on one slice) must be whole
    groups, and the Pallas attention needs the prompt and the completion each a multiple of 128 tokens. Else 1:
    every row runs its own prompt."""
    G, C = cfg.rollout.samples_per_prompt, cfg.rollout.max_new_tokens
    if not cfg.train.shared_prompt or G < 2 or rows % G:
        return 1
    if attention == "pallas" and (flash.supported(P_len) or flash.supported(C)):
        return 1
    return G


def completion_logp(
    params: Any, mconf: Any, mb: dict[str, jax.Array], P_len: int, cfg: Config, impl: str
) -> tuple[jax.Array, jax.Array]:
    """(log p, entropy) [B, C] of the completion tokens under `params`, on temperature-scaled logits; each
    group's prompt run once where `prompt_groups` allows."""
    C = cfg.rollout.max_new_tokens
    G = prompt_groups(cfg, mb["ids"].shape[0], P_len, mconf.attention)
    if G > 1:  # the rows are np.repeat's groups (trainer.loop.rollout): row u * G holds prompt u

        def first(x: jax.Array) -> jax.Array:
            return x[:, :P_len].reshape(-1, G, P_len)[:, 0]

        h_UPD, h_BCD = forward_hidden_grouped(
            params, mconf, *(first(mb[k]) for k in ("ids", "pos", "mask")),
            *(mb[k][:, P_len:] for k in ("ids", "pos", "mask")),
        )  # fmt: skip
        # Position P - 1 (the prompt's last) predicts completion token 0, completion position t token t + 1.
        h_BCD = jnp.concatenate([jnp.repeat(h_UPD[:, -1:], G, axis=0), h_BCD[:, : C - 1]], axis=1)
    else:
        hidden_BSD = forward_hidden(params, mconf, mb["ids"], mb["pos"], mb["mask"])
        h_BCD = hidden_BSD[:, P_len - 1 : P_len - 1 + C]  # position t predicts token t + 1
    return token_logprob_entropy_from_hidden(
        h_BCD, lm_head_weight(params, mconf), mb["comp"], temperature=cfg.rollout.temperature, impl=impl
    )


def make_loss_fn(cfg: Config, mconf: Any, P_len: int, impl: str) -> Any:
    """loss_fn(params, micro_batch, dapo_tokens, whole=None) -> (loss, aux): the GRPO objective of one
    micro-batch, or with `whole` = (rows, tokens) of the micro-batch, the share of its rows here (grpo_objective)."""

    def loss_fn(
        params: Any, mb: dict[str, jax.Array], dapo_tokens: jax.Array, whole: Any = None
    ) -> tuple[jax.Array, Any]:
        logp_BC, ent_BC = completion_logp(params, mconf, mb, P_len, cfg, impl)
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
            whole=whole,
        )

    return loss_fn


def make_update(cfg: Config, mconf: Any, P_len: int, impl: str, like: tuple[Any, Any]) -> OnMesh:
    """update(params, opt_state, batch, steps): one jitted step, the mean of the micro-batch gradients
    (lax.scan) applied once by optimizer(cfg, steps), `steps` the run's length as an int32 value (so
    train.steps is not compiled in); traced on the params' mesh with each decoder layer rematerialised per
    train.remat and its attention per train.attention_impl.

    The micro-batch loop runs inside a shard_map that is manual over the mesh's dcn axis only (dp, fsdp and tp
    stay XLA's): each slice takes its own rows of every micro-batch, sums their gradients on its ICI, and the
    sums cross DCN once, after the loop (left to XLA, the reduction over slices happens inside every
    micro-batch's backward: K times the gradients' bytes over DCN). On one slice (dcn of size 1) the loop
    runs as it is, without the shard_map.

    Outputs keep the inputs' shardings (`like` = (params, opt_state)): if XLA chose its own, the next step's
    inputs would differ and the update would compile again.
    """
    n_micro = cfg.accumulation_steps
    attention = flash.resolve(cfg.train.attention_impl, P_len + cfg.rollout.max_new_tokens)
    loss_fn = make_loss_fn(cfg, mconf.replace(remat=cfg.train.remat, attention=attention), P_len, impl)
    shardings = jax.tree_util.tree_map(lambda x: x.sharding, like)
    mesh = jax.tree_util.tree_leaves(shardings)[0].mesh
    slices = mesh.shape[DCN_AXIS]

    def over_slices(x: Any) -> Any:
        """The sum over slices (one cross-DCN reduction); on one slice there is nothing to sum."""
        return jax.lax.psum(x, DCN_AXIS) if slices > 1 else x

    def accumulate(params: Any, batch: dict[str, jax.Array]) -> tuple[Any, jax.Array, Any, jax.Array]:
        """One slice's rows: (gradient sum, [K] losses, [K] aux), each summed over the slices, and [K] the
        micro-batches' completion tokens (all slices')."""
        micro = jax.tree_util.tree_map(lambda x: x.reshape(n_micro, -1, *x.shape[1:]), batch)
        rows = micro["adv"].shape[1] * slices  # a micro-batch's rows, all slices together
        tokens_K = over_slices(micro["comp_mask"].sum(axis=(1, 2)).astype(jnp.float32))
        dapo_tokens = tokens_K.sum() / n_micro
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)

        def body(acc: Any, xs: tuple[dict[str, jax.Array], jax.Array]) -> tuple[Any, Any]:
            mb, tokens = xs
            (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                params, mb, dapo_tokens, (rows, tokens)
            )
            return jax.tree_util.tree_map(jnp.add, acc, grads), (loss, aux)

        grads, (losses_K, auxes_K) = jax.lax.scan(body, zeros, (micro, tokens_K))
        return (*over_slices((grads, losses_K, auxes_K)), tokens_K)

    def update(
        params: Any, opt_state: Any, batch: dict[str, jax.Array], steps: jax.Array
    ) -> tuple[Any, Any, dict[str, jax.Array]]:
        per_slice = accumulate
        if slices > 1:
            # check_vma=False: with JAX's replication typing, the gradient of the slice-invariant params would
            # be summed over dcn in every micro-batch's backward (and the model's loops, whose carries start
            # from constants, would not type-check); unchecked, each slice's gradient is its own until the psum.
            batch_specs = jax.tree_util.tree_map(lambda _: P(DCN_AXIS), batch)
            per_slice = jax.shard_map(
                accumulate, in_specs=(P(), batch_specs), out_specs=P(), axis_names={DCN_AXIS}, check_vma=False
            )
        grads, losses, auxes, tokens = per_slice(params, batch)
        grads = jax.tree_util.tree_map(lambda g: g / n_micro, grads)
        updates, opt_state = optimizer(cfg, steps).update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        out = {"loss": losses.mean(), "grad_norm": optax.global_norm(grads)}
        # Each aux is a micro-batch's token mean: weighted by its tokens, the step's token mean (a plain mean
        # of the K means is not, when completions end at different lengths).
        weights = tokens / jnp.maximum(tokens.sum(), 1.0)
        out.update({k: (v * weights).sum() for k, v in auxes.items()})
        return params, opt_state, out

    return OnMesh(
        jax.jit(
            update, donate_argnums=(0, 1), out_shardings=(*shardings, None),
            compiler_options=tpu_options(cfg, mesh),
        ),
        mesh,
    )  # fmt: skip


def tpu_options(cfg: Config, mesh: Any) -> dict[str, Any] | None:
    """The compiler options of the programs on the training mesh (the update, the reference log-probs) when
    its devices are TPUs (compile-only ones too: trainer.fit); None elsewhere, whose compilers know no TPU
    option."""
    if mesh.devices.flat[0].platform != "tpu":
        return None
    return {"xla_tpu_enable_windowed_einsum_for_all_gather": cfg.train.collective_matmul}


def make_ref_logp(cfg: Config, mconf: Any, impl: str, mesh: Any) -> OnMesh:
    """ref_logp(ref_params, batch, P) -> the frozen reference policy's log-probs [N, C] (no gradient)."""

    def ref_logp(params: Any, b: dict[str, jax.Array], P_len: int) -> jax.Array:
        logp, _ = completion_logp(params, mconf, b, P_len, cfg, impl)
        return jax.lax.stop_gradient(logp)

    return OnMesh(jax.jit(ref_logp, static_argnums=2, compiler_options=tpu_options(cfg, mesh)), mesh)
