"""The programs one GRPO step runs, lowered for a TPU topology with the trainer's own code and shardings (or, under
a GPU compile target, for a GPU's deviceless topology: bench/device_aot.py).

Dims: N sequences per step, P prompt bucket (the largest: the worst case), C max new tokens, M micro-batch.
Phases: `decode_cast` (weights to the compute dtype, decode layout), `prefill`, `decode` (the whole
while_loop), `ref_logp` (loss.beta > 0) and `update` (the jitted step with its lax.scan over micro-batches).
Costs are loop-aware (trainer.fit.hlo): a loop whose trip count the compiled text shows (a scan over layers,
the update's lax.scan over micro-batches) is counted that many times, so every phase runs once per step. The
decode's while_loop also stops when every sequence is done, so its trip count is unknown to the text: it is
given as C - 1 tokens (`loop_trips`, the worst case), and what the decode program does outside its loop (a
one-time relayout of the KV cache, say) counts once.
Each phase also holds what stays in HBM while it runs but is not its argument (`resident_bytes`): the FSDP
parameters and optimizer state during the rollout.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from trainer.config import Config
from trainer.kernels import resolve_impl
from trainer.kernels.logprob.blocks import on_gpu
from trainer.layout import OnMesh, decode_layout, decode_params_like, opt_state_shardings
from trainer.loop.programs import make_ref_logp, make_update, optimizer, prompt_groups
from trainer.model import flash
from trainer.model.config import Qwen2Config, preset
from trainer.model.qwen2 import Qwen2
from trainer.sampling import sampler
from trainer.sharding import DCN_AXIS, batch_axes, batch_devices, head_counts, make_mesh, param_shardings


@dataclass
class Program:
    name: str
    lowered: Any  # jax Lowered
    resident_bytes: int  # per device, alive beside the program's own buffers
    error: str | None = None  # already known not to compile (libtpu's RESOURCE_EXHAUSTED)
    compiled: Any = None  # already compiled (the prefill: the decode's state comes from its outputs)
    compile_s: float = 0.0  # how long that compile took
    loop_trips: int = 1  # runs of a loop whose trip count the HLO does not show (the decode loop: C - 1)


def model_config(cfg: Config) -> Qwen2Config:
    """The model's shapes: a local folder's config.json, else the preset (hub ids are not fetched);"""
    folder = Path(cfg.model.path).expanduser()
    if (folder / "config.json").is_file():
        mconf = Qwen2Config.from_hf(json.loads((folder / "config.json").read_text()), dtype=cfg.model.dtype)
    else:
        mconf = preset(cfg.model.preset).replace(dtype=cfg.model.dtype)
    return mconf


def device_bytes(tree: Any) -> int:
    """Bytes one device holds of a pytree of sharded ShapeDtypeStructs (the largest shard)."""
    total = 0
    for x in jax.tree_util.tree_leaves(tree):
        shard = x.sharding.shard_shape(x.shape)
        total += int(np.prod(shard, dtype=np.int64)) * jnp.dtype(x.dtype).itemsize
    return total


def _sds(shape: tuple[int, ...], dtype: Any, sharding: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _batch(mesh: Mesh, shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    return _sds(shape, dtype, NamedSharding(mesh, P(batch_axes(mesh), *([None] * (len(shape) - 1)))))


def training_mesh(cfg: Config, devices: list[Any]) -> Mesh:
    """The mesh startup.start_up builds (fsdp 0 = every remaining device of a slice); on a multislice topology
    (devices with several `slice_index`) the slices are the dcn axis and mesh.dp, fsdp and tp are per slice."""
    devices = devices[: cfg.mesh.devices or None]
    slices = len({getattr(d, "slice_index", 0) for d in devices})
    fsdp = cfg.mesh.fsdp or len(devices) // (slices * cfg.mesh.dp * cfg.mesh.tp)
    return make_mesh(cfg.mesh.dp, fsdp, cfg.mesh.tp, devices, slices)


def state(cfg: Config, mconf: Qwen2Config, mesh: Mesh) -> tuple[Any, Any]:
    """(params, optimizer state) as sharded ShapeDtypeStructs, laid out as train.run lays them out."""
    shapes = jax.eval_shape(
        lambda: Qwen2(mconf).init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32), method=Qwen2.init_all)
    )["params"]
    shardings = param_shardings(shapes, mesh, head_counts(mconf))
    params = jax.tree_util.tree_map(lambda x, s: _sds(x.shape, x.dtype, s), shapes, shardings)
    opt = optimizer(cfg)
    shapes = jax.eval_shape(opt.init, params)
    opt_state = jax.tree_util.tree_map(
        lambda x, s: _sds(x.shape, x.dtype, s), shapes, opt_state_shardings(opt, params, mesh)
    )
    return params, opt_state


def platform() -> str:
    """The platform the programs are built for: gpu under a GPU compile target (`compile_target("gpu ...")`),
    else tpu (`tpuops fit`'s TPU topologies)."""
    return "gpu" if on_gpu() else "tpu"


def update_batch_like(mesh: Mesh, N: int, P_len: int, C: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The update's batch as trainer/loop/update.py builds it from a rollout, as sharded ShapeDtypeStructs."""
    S = P_len + C
    return {
        "ids": _batch(mesh, (N, S), jnp.int32), "mask": _batch(mesh, (N, S), jnp.int32),
        "pos": _batch(mesh, (N, S), jnp.int32), "comp": _batch(mesh, (N, C), jnp.int32),
        "comp_mask": _batch(mesh, (N, C), jnp.int32), "old_logp": _batch(mesh, (N, C), jnp.float32),
        "adv": _batch(mesh, (N,), jnp.float32),
    }  # fmt: skip


ROLLOUT = ("decode_cast", "prefill", "decode")
UPDATE = ("ref_logp", "update")


def step_programs(
    cfg: Config,
    devices: list[Any],
    only: tuple[str, ...] = ROLLOUT + UPDATE,
    mconf: Qwen2Config | None = None,
) -> tuple[list[Program], dict[str, Any]]:
    """Every program of one step (or those named in `only`), lowered; plus facts for the report. `mconf`: the
    model's shapes (default: the config's, `model_config`)."""
    mconf = mconf or model_config(cfg)
    mesh = training_mesh(cfg, devices)
    cfg.check_batch(len({d.process_index for d in devices}), batch_devices(mesh))
    params, opt_state = state(cfg, mconf, mesh)
    N, P_len, C = cfg.sequences_per_step, max(cfg.data.prompt_buckets), cfg.rollout.max_new_tokens
    impl = resolve_impl(cfg.train.loss_impl, platform())
    programs: list[Program] = []

    # Rollout: the decode layout, prefill, the decode loop and one decode iteration.
    rmesh, to_decode = decode_layout(mesh, mconf, params, cfg.rollout.tp)
    if any(name in only for name in ROLLOUT):
        programs += _rollout(cfg, mconf, params, opt_state, rmesh, to_decode)
    if any(name in only for name in UPDATE):
        programs += _update(cfg, mconf, mesh, params, opt_state, impl)
    update_attention = flash.resolve(cfg.train.attention_impl, P_len + C)  # what make_update resolves it to
    facts = {
        "impl": impl, "mesh": dict(mesh.shape), "rollout_mesh": dict(rmesh.shape),
        "params_bytes": device_bytes(params), "opt_state_bytes": device_bytes(opt_state),
        "batch_devices": batch_devices(mesh), "sequences": N, "prompt_len": P_len, "new_tokens": C,
        "micro_batch": cfg.train.micro_batch, "accumulation": cfg.accumulation_steps, "remat": cfg.train.remat,
        "attention": {  # what train.attention_impl resolves to on this TPU (trainer.model.flash)
            "update": update_attention,
            "prefill": flash.resolve(cfg.train.attention_impl, P_len, strict=False),
        },
        # The update runs each prompt once for this many rows (1: every row its own; train.shared_prompt).
        "prompt_once_per": prompt_groups(cfg, cfg.train.micro_batch // mesh.shape[DCN_AXIS], P_len, update_attention),
    }  # fmt: skip
    return [p for p in programs if p.name in only], facts


def _rollout(
    cfg: Config, mconf: Qwen2Config, params: Any, opt_state: Any, rmesh: Mesh, to_decode: OnMesh
) -> list[Program]:
    N, P_len, C = cfg.sequences_per_step, max(cfg.data.prompt_buckets), cfg.rollout.max_new_tokens
    resident = device_bytes(params) + device_bytes(opt_state)
    programs: list[Program] = []
    programs.append(Program("decode_cast", to_decode.lower(params), device_bytes(opt_state)))
    rparams = decode_params_like(mconf, params, rmesh)  # what to_decode makes: fused, compute dtype
    sampling = sampler.for_rollout(cfg.rollout, platform())  # the layer loop the run picks there
    # The prefill's attention as the run picks it for the largest bucket (trainer.loop.rollout).
    mconf = mconf.replace(attention=flash.resolve(cfg.train.attention_impl, P_len, strict=False))
    # Rows in groups of samples_per_prompt, as the run's (trainer.loop.rollout): the prefill runs each prompt
    # once and the decode reads each group's prompt slots once.
    static = sampler.static_args(mconf, sampling, (1,), 0, rmesh, cfg.rollout.samples_per_prompt)
    rng = jax.eval_shape(lambda: jax.random.key(0))
    ids = _batch(rmesh, (N, P_len), jnp.int32)
    prefill = OnMesh(sampler._prefill, rmesh).lower(rparams, ids, ids, rng, **static)
    print("fit: compiling prefill", file=sys.stderr, flush=True)  # tpuops fit's status line shows it
    t0 = time.perf_counter()
    try:
        prefill_out = prefill.compile()
    except Exception as e:  # too big for the TPU: both rollout programs are judged by this
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        programs.append(Program("prefill", prefill, resident, error=str(e)))
        programs.append(Program("decode", None, resident, error="not compiled: the prefill does not fit"))
        return programs
    programs.append(
        Program("prefill", prefill, resident, compiled=prefill_out, compile_s=time.perf_counter() - t0)
    )
    dstate = jax.tree_util.tree_map(
        lambda x, s: _sds(x.shape, x.dtype, s), prefill_out.out_info, prefill_out.output_shardings
    )
    decode = OnMesh(sampler._decode, rmesh).lower(rparams, dstate, **static)
    programs.append(Program("decode", decode, resident, loop_trips=max(C - 1, 1)))
    return programs


def _update(
    cfg: Config, mconf: Qwen2Config, mesh: Mesh, params: Any, opt_state: Any, impl: str
) -> list[Program]:
    N, P_len, C = cfg.sequences_per_step, max(cfg.data.prompt_buckets), cfg.rollout.max_new_tokens
    resident = device_bytes(params) + device_bytes(opt_state)
    programs: list[Program] = []
    # Update: the jitted step; its lax.scan over micro-batches is counted trip-count times by trainer.fit.hlo.
    batch: dict[str, Any] = dict(update_batch_like(mesh, N, P_len, C))
    if cfg.loss.beta > 0:
        ref = make_ref_logp(cfg, mconf, impl, mesh)
        programs.append(Program("ref_logp", ref.lower(params, batch, P_len), resident))
        batch["ref_logp"] = _batch(mesh, (N, C), jnp.float32)
    update = make_update(cfg, mconf, P_len, impl, (params, opt_state))
    steps = jax.ShapeDtypeStruct((), jnp.int32)
    programs.append(Program("update", update.lower(params, opt_state, batch, steps), 0))
    return programs
