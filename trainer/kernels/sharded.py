"""Loss kernels over a batch split across devices: each device runs the kernel on its own rows (shard_map).

Mosaic (Pallas TPU) kernels cannot be partitioned by XLA, and the chunked XLA loops would slice a global
array; so under a mesh in context (`jax.set_mesh`) the per-device kernel runs inside `jax.shard_map` with the
rows split over the batch axes (dcn, dp, fsdp) and the LM-head weight whole on every device (XLA all-gathers
it, as FSDP does for every layer). The backward runs the kernel's own VJP per device and reduce-scatters dW
over the batch axes (a psum where the hidden size does not divide), so the gradient is exact. Inside a
shard_map that is already manual over some of them (the update, over dcn), only the others are split here.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from jax import Array
from jax.sharding import PartitionSpec as P

from trainer.sharding import BATCH

Kernel = Callable[[Array, Array, Array], tuple[Array, Array]]  # (h_BTD, w_DV, ids_BT) -> (logp_BT, ent_BT)


def active_mesh() -> jax.sharding.AbstractMesh | None:
    """The mesh in context when it has more than one device, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty or mesh.size == 1 else mesh


def batch_sharded(kernel: Kernel, h_BTD: Array, w_DV: Array, ids_BT: Array) -> tuple[Array, Array]:
    """`kernel` applied per device to its batch rows; differentiable w.r.t. h and w."""
    mesh = active_mesh()
    manual = set(mesh.manual_axes) if mesh is not None else set()
    axes = tuple(a for a in BATCH if mesh is not None and mesh.shape[a] > 1 and a not in manual)
    if mesh is None or not axes:
        return kernel(h_BTD, w_DV, ids_BT)
    n_dev = int(np.prod([mesh.shape[a] for a in axes]))
    if h_BTD.shape[0] % n_dev:
        raise ValueError(f"batch {h_BTD.shape[0]} must be a multiple of the {n_dev} batch devices {axes}")
    rows = P(axes)
    scatter = w_DV.shape[0] % n_dev == 0
    dw_spec = P(axes) if scatter else P()

    def local_bwd(h: Array, w: Array, ids: Array, g_logp: Array, g_ent: Array) -> tuple[Array, Array]:
        _, vjp = jax.vjp(lambda h, w: kernel(h, w, ids), h, w)
        dh, dw = vjp((g_logp, g_ent))
        if scatter:
            # Over a leading axis of its own: libtpu then reduce-scatters (over D itself it all-reduced, twice the bytes).
            parts = dw.reshape(n_dev, dw.shape[0] // n_dev, *dw.shape[1:])
            return dh, jax.lax.psum_scatter(parts, axes, scatter_dimension=0, tiled=True)[0]
        return dh, jax.lax.psum(dw, axes)

    def smap(f: Callable, n_in: int, out_specs: tuple) -> Callable:
        in_specs = (rows, P(), *([rows] * (n_in - 2)))
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)

    @jax.custom_vjp
    def run(h: Array, w: Array) -> tuple[Array, Array]:
        return smap(kernel, 3, (rows, rows))(h, w, ids_BT)

    def fwd(h: Array, w: Array) -> tuple[tuple[Array, Array], tuple[Array, Array]]:
        return run(h, w), (h, w)

    def bwd(res: tuple[Array, Array], g: tuple[Array, Array]) -> tuple[Array, Array]:
        h, w = res
        dh, dw = smap(local_bwd, 5, (rows, dw_spec))(h, w, ids_BT, *g)
        return dh, dw.astype(w.dtype)

    run.defvjp(fwd, bwd)
    return run(h_BTD, w_DV)
