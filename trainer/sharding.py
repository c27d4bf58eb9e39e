"""Device mesh with axes (dcn, dp, fsdp, tp) and the partition rules for parameters, activations and KV cache.

Parameters: one table of (regex on the "/"-joined param path -> PartitionSpec). Matrices split their
input dim over fsdp and their output (head/MLP/vocab) dim over tp. An axis that does not divide its dim is
dropped (replicated) for that parameter, so tiny models and odd head counts still shard.
Activations carry logical axis names (`batch`, `group_rows`, `length`, `embed`, `heads`, `kv_heads`, `mlp`, `vocab`) and
one table (LOGICAL) maps them to mesh axes; the model constrains them by name at every layer boundary
(`constrain`), so the batch stays split over (dcn, dp, fsdp) and XLA all-gathers each layer's weights (FSDP)
instead of all-reducing whole-batch activations. Constraints apply under `jax.set_mesh(mesh)` and are no-ops
without a mesh in context (single-device code and tests).
KV cache, [L, B, S, K, H] for keys and for values: batch over (dcn, dp, fsdp), kv heads over tp where tp divides them,
else the batch over tp too (`heads_split`: each device its own sequences, whole heads; a decode on a mesh
`rollout_mesh` did not make).
Decode uses its own layout of the same devices (`rollout_mesh`: batch over dcn and dp, heads over tp, no fsdp;
a tp group wider than the kv heads as (TP_SEQ_AXIS, tp), kv heads x sequences, its residual stream's rows split
over the whole group: `residual`; the LM head's vocabulary over the slice: `slice_vocab`) with the weights cast to
the compute dtype once per step: a decode loop over FSDP-split weights would all-gather every weight for every
token (`tpuops fit` shows the difference).
The same code runs on 1 device, on forced CPU devices, and across processes with jax.distributed (the
mesh then spans jax.devices(), i.e. every process's devices).
Multislice: `dcn` (DCN_AXIS, the outermost axis, one row per slice; size 1 on one slice) is the only axis that
crosses slices, and only the batch maps to it: every slice holds whole parameters (split over its own fsdp and
tp), so fsdp's all-gathers and tp's collectives stay on a slice's ICI and the one collective over DCN is the
update's gradient reduction (trainer.loop.programs.make_update: once per update, after the micro-batches).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

# The one mesh axis that crosses slices (data-center network, ~10x slower than ICI): data parallelism over
# slices, whose only collective in a step is the gradients' reduction. dp, fsdp and tp stay inside one slice.
DCN_AXIS = "dcn"
AXES = (DCN_AXIS, "dp", "fsdp", "tp")
BATCH = (DCN_AXIS, "dp", "fsdp")
# Only in a decode mesh whose tp group is wider than the kv heads split (`rollout_mesh`: the 3B's 2 kv heads over
# rollout.tp 4): the group's devices as (TP_SEQ_AXIS, "tp"), "tp" as many ways as whole kv heads allow. The
# attention and the KV cache split by kv head over "tp" and by sequence over TP_SEQ_AXIS; the MLP and the
# vocabulary over both, as one tp group. Names of axes a mesh does not have are dropped (`_fit`).
TP_SEQ_AXIS = "tps"
TP_GROUP = (TP_SEQ_AXIS, "tp")

# Logical activation axis -> mesh axes (MaxText's logical_axis_rules, one table). Only the batch's rows
# (`batch`, `group_rows`) may name DCN_AXIS; no rule in PARAM_RULES may (tests/trainer/test_multislice_mesh.py
# checks both). A mesh axis named by two dims of one activation stays with the other dim and leaves `batch`
# (`logical_spec`): the MLP's [B, T, F] keeps F over the whole tp group and its rows whole within it.
LOGICAL: dict[str, Any] = {
    "batch": (*BATCH, TP_SEQ_AXIS),
    # The rows of an input to a matmul split over the whole tp group (the MLP, the LM head): whole within the
    # group, so that only the TP_SEQ_AXIS neighbours exchange them (left to XLA, it gathered the whole batch).
    "group_rows": BATCH,
    # The decode's residual stream between the tp group's matmuls (sequence parallel, Megatron-style): rows split
    # over the whole group, so each partial sum is reduce-scattered and gathered where a matmul needs the rows.
    "residual": (*BATCH, TP_SEQ_AXIS, "tp"),
    "length": None,
    "embed": None,
    "heads": "tp",
    "kv_heads": "tp",
    "head_dim": None,
    "mlp": TP_GROUP,
    "vocab": TP_GROUP,
    # The decode's LM head and draw: the vocabulary over every device of a slice, each device's block a half of its
    # tp-group block (dp minor), and the rows whole within the slice.
    "slice_rows": DCN_AXIS,
    "slice_vocab": (*TP_GROUP, "dp"),
}

PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r"embed_tokens/embedding", P(TP_GROUP, "fsdp")),  # [V, D]
    # Decoder layers are stacked ([L, ...], the layer scan's input): the layer axis is never split.
    # The fused projections (trainer/model/fusion.py) split over tp along the kv heads or the MLP columns, never
    # along their part axis: each device's slice holds matching q, k and v heads, or gate and up columns.
    (r"layers/self_attn/qkv_proj/kernel", P(None, "fsdp", "tp", None, None)),  # [L, D, K, G + 2, H]
    (r"layers/self_attn/qkv_proj/bias", P(None, "tp", None, None)),  # [L, K, G + 2, H]
    (r"layers/mlp/gate_up_proj/kernel", P(None, "fsdp", None, TP_GROUP)),  # [L, D, 2, F]
    # Hugging Face's separate projections (the unfused reference model of the tests).
    (r"layers/self_attn/[qkv]_proj/kernel", P(None, "fsdp", "tp")),  # [L, D, heads*H]
    (r"layers/self_attn/[qkv]_proj/bias", P(None, "tp")),
    (r"layers/self_attn/o_proj/kernel", P(None, "tp", "fsdp")),  # [L, N*H, D]
    (r"layers/mlp/(gate|up)_proj/kernel", P(None, "fsdp", TP_GROUP)),  # [L, D, F]
    (r"layers/mlp/down_proj/kernel", P(None, TP_GROUP, "fsdp")),  # [L, F, D]
    (r"lm_head/kernel", P("fsdp", TP_GROUP)),  # [D, V]
    (r".*(layernorm|norm)/scale", P()),
)


def make_mesh(
    dp: int, fsdp: int, tp: int, devices: Sequence[jax.Device] | None = None, num_slices: int = 1
) -> Mesh:
    """A (dcn, dp, fsdp, tp) mesh over `devices` (default: all devices of all processes): dcn = `num_slices`,
    and dp, fsdp and tp inside each slice. On TPU by `create_hybrid_device_mesh` (devices grouped by
    `slice_index`); elsewhere devices come in slice order already (process ids run slice by slice, as JAX numbers
    them on a multislice), so the plain reshape puts slice s in dcn row s."""
    devices = list(jax.devices() if devices is None else devices)
    if num_slices * dp * fsdp * tp != len(devices):
        shape = f"{dp}x{fsdp}x{tp}" if num_slices == 1 else f"{num_slices} slices x {dp}x{fsdp}x{tp}"
        raise ValueError(f"mesh dp*fsdp*tp must equal the device count {len(devices)}, received {shape}")
    # TPU devices say their slice; gloo's CPU devices all say 0 (their processes come in slice order).
    if num_slices > 1 and len({getattr(d, "slice_index", 0) for d in devices}) == num_slices:
        from jax.experimental import mesh_utils

        try:
            hybrid = mesh_utils.create_hybrid_device_mesh((1, dp, fsdp, tp), (num_slices, 1, 1, 1), devices)
            return Mesh(hybrid, AXES)
        except AssertionError:  # TPU v4 shows a device per TensorCore: JAX lays out only one per chip
            devices = sorted(devices, key=lambda d: d.slice_index)  # each slice in its own dcn row
    return Mesh(np.asarray(devices).reshape(num_slices, dp, fsdp, tp), AXES)


def batch_devices(mesh: Any) -> int:
    """How many ways a batch splits: the devices along (dcn, dp, fsdp) and, in a decode mesh, TP_SEQ_AXIS."""
    return int(np.prod([mesh.shape[a] for a in batch_axes(mesh)]))


def batch_axes(mesh: Any) -> tuple[str, ...]:
    """The mesh axes a batch splits over: (dcn, dp, fsdp), and TP_SEQ_AXIS where the mesh has it."""
    return tuple(a for a in LOGICAL["batch"] if a in dict(mesh.shape))


def _fit(spec: P, shape: tuple[int, ...], mesh: Any) -> P:
    """Drop mesh axes that do not divide their dimension: a tuple of axes keeps its longest prefix that
    divides (the rest of that dimension is replicated). Axes that are manual in the mesh in context (inside a
    shard_map over them, as the update is over dcn) are dropped too: there each device sees its own part; and
    axes the mesh does not have (TP_SEQ_AXIS outside a decode mesh that has it)."""
    manual = set(getattr(mesh, "manual_axes", ()))
    present = set(dict(mesh.shape))
    fitted: list[Any] = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
        names = tuple(a for a in _names(axes) if a not in manual and a in present)
        full = names
        while names and dim % int(np.prod([mesh.shape[a] for a in names])):
            names = names[:-1]
        if names != full and int(np.prod([mesh.shape[a] for a in names])) == 1:
            names = ()  # only size-1 axes left: plainly replicated
        fitted.append(None if not names else names[0] if isinstance(axes, str) else names)
    return P(*fitted)


# The attention projections' head dims ([qkv]_proj's output, o_proj's input): "q" counts query heads, "kv" kv heads.
# (The fused qkv_proj splits along its kv-head axis, which `_fit` keeps whole by itself.)
_HEAD_DIMS = re.compile(r"layers/self_attn/(?:(?P<q>[qo])|(?P<kv>[kv]))_proj/(?:kernel|bias)")


def param_spec(path: str, shape: tuple[int, ...], mesh: Mesh, heads: tuple[int, int] | None = None) -> P:
    """The PartitionSpec of one parameter, by the first matching rule. With `heads` (query heads, kv heads), an
    attention projection splits its head dim over tp only in whole heads: 2 kv heads over tp = 4 would give each
    device half a head, and every layer would all-gather its new keys and values (twice a layer and token in the
    decode, where latency is most of a collective's cost); kept whole, each device computes both heads itself."""
    for pattern, rule in PARAM_RULES:
        if re.fullmatch(pattern, path):
            spec = _fit(rule, shape, mesh)
            m = _HEAD_DIMS.fullmatch(path)
            if heads and m and not heads_split(heads[0 if m["q"] else 1], mesh):
                return P(*(None if axes == "tp" else axes for axes in spec))
            return spec
    raise KeyError(f"no partition rule for parameter {path!r}")


def path_str(key_path: Sequence[Any]) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in key_path)


def head_counts(config: Any) -> tuple[int, int]:
    """A model config's (query heads, kv heads): what `param_spec` keeps whole."""
    return config.num_attention_heads, config.num_key_value_heads


def param_shardings(params: Any, mesh: Mesh, heads: tuple[int, int] | None = None) -> Any:
    """A pytree of NamedSharding matching `params` (arrays or ShapeDtypeStructs); `heads` as in `param_spec`."""
    return jax.tree_util.tree_map_with_path(
        lambda kp, x: NamedSharding(mesh, param_spec(path_str(kp), tuple(x.shape), mesh, heads)), params
    )


def shard_params(params: Any, mesh: Mesh) -> Any:
    """Place host or single-device params onto the mesh by the rules (single process)."""
    return jax.device_put(params, param_shardings(params, mesh))


def batch_sharding(mesh: Mesh, shape: tuple[int, ...]) -> NamedSharding:
    """Activations/inputs [B, ...]: batch over (dcn, dp, fsdp) (and TP_SEQ_AXIS in a decode mesh that has it),
    the rest replicated."""
    return NamedSharding(mesh, _fit(P(LOGICAL["batch"]), shape, mesh))


def kv_cache_sharding(mesh: Mesh, shape_LBSKH: tuple[int, ...]) -> NamedSharding:
    """The stacked KV cache [L, B, S, K, H]: batch over (dcn, dp, fsdp), kv heads over tp; `cache_spec`."""
    return NamedSharding(mesh, cache_spec(shape_LBSKH, mesh))


def cache_spec(shape_LBSKH: tuple[int, ...], mesh: Any) -> P:
    """The KV cache's spec: kv heads over tp where tp divides them; else the batch over tp too (`heads_split`)."""
    if heads_split(shape_LBSKH[3], mesh):
        return logical_spec((None, "batch", None, "kv_heads", None), shape_LBSKH, mesh)
    return _fit(P(None, (*BATCH, "tp")), shape_LBSKH, mesh)


def heads_split(n_heads: int, mesh: Any) -> bool:
    """Whether tp splits `n_heads` heads whole (tp divides them). For the kv heads: whether the decode splits its
    attention and KV cache over tp by kv head, or else by sequence: with 2 kv heads over tp = 4 a head split would
    give each pair of devices one head's cache, held and read twice; split by sequence, each device holds and
    reads only its own sequences' cache (both heads), and the queries and attention outputs cross the tp group by
    two all-to-alls a layer (trainer.model.qwen2.Attention). `rollout_mesh` never makes such a mesh (it splits
    that group into kv heads x sequences, two collectives a layer fewer); a decode on a mesh of the caller's
    own (`sampler.generate(..., mesh=...)`) still runs this way."""
    tp = int(dict(mesh.shape).get("tp", 1))
    return n_heads % tp == 0


def constrain_cache(x_LBSKH: jax.Array) -> jax.Array:
    """Pin the stacked KV cache to `cache_spec` under the mesh in context (no mesh: unchanged)."""
    return _pin(x_LBSKH, cache_spec)


def constrain_sequences(x_BTNH: jax.Array) -> jax.Array:
    """Queries or attention outputs [B, T, N, H] split by sequence over (dcn, dp, fsdp, tp), heads whole: the
    decode's attention when the kv heads do not split over tp (`heads_split`)."""
    return _pin(x_BTNH, lambda shape, mesh: _fit(P((*BATCH, "tp")), shape, mesh))


def _pin(x: jax.Array, spec: Callable[[tuple[int, ...], Any], P]) -> jax.Array:
    """`x` constrained to `spec(its shape, the mesh in context)`; unchanged without a mesh or on one device."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, spec(tuple(x.shape), mesh))


def logical_spec(names: Sequence[str | None], shape: tuple[int, ...], mesh: Any) -> P:
    """The PartitionSpec of an activation whose dims are named `names` (None: replicated). A mesh axis that
    another dim also names leaves `batch` (in a decode mesh with TP_SEQ_AXIS, the MLP's and the LM head's rows
    are whole within the tp group while F or the vocabulary split over all of it)."""
    spec = _fit(P(*[LOGICAL[n] if n else None for n in names]), shape, mesh)
    taken = {a for n, axes in zip(names, spec, strict=False) if n != "batch" for a in _names(axes)}
    if "batch" not in names or not taken:
        return spec
    i = list(names).index("batch")
    kept = tuple(a for a in _names(spec[i]) if a not in taken)
    return P(*spec[:i], kept or None, *spec[i + 1 :])


def vocab_axes(vocab: int, mesh: Any, name: str = "vocab") -> tuple[str, ...]:
    """The mesh axes a vocabulary of `vocab` splits over (its tp group, as far as it divides; `name` the logical
    name, e.g. the decode's `slice_vocab`)."""
    return _names(logical_spec((name,), (vocab,), mesh)[0])


def vocab_ways(vocab: int, mesh: Any, name: str = "vocab") -> int:
    """How many blocks a vocabulary of `vocab` splits into under `mesh` (`vocab_axes`)."""
    return int(np.prod([mesh.shape[a] for a in vocab_axes(vocab, mesh, name)]))


def _names(axes: Any) -> tuple[str, ...]:
    return (axes,) if isinstance(axes, str) else tuple(axes or ())


def constrain(x: jax.Array, *names: str | None) -> jax.Array:
    """Pin an activation's layout by logical names under the mesh in context (no mesh: unchanged)."""
    return _pin(x, lambda shape, mesh: logical_spec(names, shape, mesh))


def lookup_layout(table_VD: jax.Array) -> jax.Array:
    """The embedding table as the token lookup reads it: as it is, except inside a shard_map manual over some
    axes (the update on a multislice, over dcn). There XLA's SPMD partitioner (jax 0.10.2, libtpu 0.0.42.1)
    aborts on a CHECK (spmd_partitioner_util.cc:497) partitioning the gather of a table whose hidden dim is
    split, once tp > 1 and the batch splits inside the slice; with the vocabulary split over (tp, fsdp) and the
    hidden dim whole (the same bytes per device; an all-to-all inside the slice) it partitions."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not mesh.manual_axes:
        return table_VD
    return jax.lax.with_sharding_constraint(
        table_VD, _fit(P(("tp", "fsdp"), None), tuple(table_VD.shape), mesh)
    )


def rollout_mesh(mesh: Mesh, tp: int, kv_heads: int = 0) -> Mesh:
    """The decode layout of `mesh`'s devices: (dcn as in `mesh`, dp = a slice's devices / tp, fsdp = 1, tp); each
    slice decodes its own rows with its own copy of the weights (tp groups never span slices). When tp splits
    more ways than the `kv_heads` whole heads allow, its group is (TP_SEQ_AXIS, tp) = (tp / h, h), h = the
    largest split of the kv heads that divides tp: the attention and the KV cache split by kv head over h and
    by sequence over tp / h, the MLP and the vocabulary over the whole group (the 3B's 2 kv heads over 4
    devices: two collectives a layer fewer than splitting the cache by sequence over all four, whose queries
    and attention outputs crossed the group by all-to-alls; docs/performance.md)."""
    slices = mesh.shape[DCN_AXIS]
    devices = mesh.devices.reshape(slices, -1)  # dcn is the outermost axis: row s is slice s's devices
    per_slice = devices.shape[1]
    if tp <= 0 or per_slice % tp:
        raise ValueError(f"rollout.tp must divide a slice's device count {per_slice}, received {tp}")
    heads = math.gcd(tp, kv_heads) if kv_heads else tp
    if heads == tp:
        return Mesh(devices.reshape(slices, per_slice // tp, 1, tp), AXES)
    shape = (slices, per_slice // tp, 1, tp // heads, heads)
    return Mesh(devices.reshape(shape), (*AXES[:3], TP_SEQ_AXIS, "tp"))
