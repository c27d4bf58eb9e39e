"""Where a training step's programs run: the update on the training mesh (FSDP), the rollout on a decode mesh
of the same devices with the weights cast once to the compute dtype and q/k/v, gate/up fused
(trainer.sharding.rollout_mesh, trainer/model/fusion.py).

Every jitted program is traced, lowered and run with its mesh in context (`OnMesh`), so the model's
activation constraints (trainer.sharding.constrain) and the batch-sharded loss kernels apply; trainer.fit
lowers exactly these programs for a TPU topology.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from trainer.model.fusion import fuse_tree
from trainer.sharding import DCN_AXIS, head_counts, param_shardings, rollout_mesh


@dataclass(frozen=True)
class OnMesh:
    """A jitted function that is traced, lowered and called with `mesh` in context."""

    fn: Any
    mesh: Mesh

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with jax.set_mesh(self.mesh):
            return self.fn(*args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        with jax.set_mesh(self.mesh):
            return self.fn.lower(*args, **kwargs)


def rollout_tp(requested: int, kv_heads: int, devices: int) -> int:
    """rollout.tp, or (0 = auto) the largest divisor of the kv-head count that divides `devices` (one slice's):
    the KV cache then splits over heads without a replicated copy, and the weights over as many devices as that
    allows (docs/performance.md compares the alternatives by their fit estimates)."""
    if requested:
        return requested
    return math.gcd(kv_heads, devices)


def decode_layout(mesh: Mesh, mconf: Any, params_like: Any, tp: int) -> tuple[Mesh, OnMesh]:
    """(decode mesh, jitted params -> compute-dtype copy laid out for decode) over `mesh`'s devices. The copy
    has the attention's q/k/v and the MLP's gate/up fused into one weight each (trainer/model/fusion.py): one
    matmul each per layer and token."""
    per_slice = mesh.devices.size // mesh.shape[DCN_AXIS]
    kv = mconf.num_key_value_heads
    rmesh = rollout_mesh(mesh, rollout_tp(tp, kv, per_slice), kv)
    dtype = jnp.dtype(mconf.dtype)
    shardings = jax.tree_util.tree_map(lambda x: x.sharding, decode_params_like(mconf, params_like, rmesh))
    cast = jax.jit(
        lambda p: fuse_tree(jax.tree_util.tree_map(lambda x: x.astype(dtype), p), kv),
        out_shardings=shardings,
    )
    return rmesh, OnMesh(cast, rmesh)


def decode_params_like(mconf: Any, params_like: Any, rmesh: Mesh) -> Any:
    """ShapeDtypeStructs of `decode_layout`'s copy of `params_like` (the training layout): fused, in the
    compute dtype, laid out on the decode mesh `rmesh`."""
    dtype = jnp.dtype(mconf.dtype)
    shapes = jax.eval_shape(
        lambda p: fuse_tree(p, mconf.num_key_value_heads),
        jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype), params_like),
    )
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        shapes,
        param_shardings(shapes, rmesh, head_counts(mconf)),
    )


def opt_state_shardings(opt: optax.GradientTransformation, params_like: Any, mesh: Mesh) -> Any:
    """The optimizer state's shardings: moments split exactly like their parameters, counters replicated.

    Left to XLA, `opt.init`'s zeros depend on no input and come out replicated: every device would hold
    the whole float32 Adam state (2 x 12 GB for a 3B model)."""
    shapes = jax.eval_shape(opt.init, params_like)
    per_param = jax.tree_util.tree_map(lambda x: x.sharding, params_like)
    replicated = NamedSharding(mesh, P())
    return optax.tree_map_params(
        opt, lambda _, s: s, shapes, per_param, transform_non_params=lambda _: replicated
    )


def init_opt_state(opt: optax.GradientTransformation, params_like: Any, mesh: Mesh) -> Any:
    """A jitted `opt.init` whose outputs are laid out by `opt_state_shardings` (call it on the params)."""
    return jax.jit(opt.init, out_shardings=opt_state_shardings(opt, params_like, mesh))
