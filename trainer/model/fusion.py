"""The fused projections' layout and its conversion from and to Hugging Face's separate tensors.

The model stores q|k|v as one weight and gate|up as another, so that each is one matmul (one read of the
activations, one kernel launch in the decode instead of three or two):
  self_attn/qkv_proj: kernel [D, K, G + 2, H], bias [K, G + 2, H]: for each kv head k its G query heads (query
    head n = k * G + g, Hugging Face's order), then its key head, then its value head;
  mlp/gate_up_proj:   kernel [D, 2, F]: the gate's columns, then the up projection's.
The part axis (G + 2, 2) is never split: split over tp along K, each device holds whole kv heads with their own
query heads; along F, matching gate and up columns (trainer/sharding.py). Concatenated along the split axis
instead, a device's slice would hold, e.g., only query heads.
Dims as trainer/model/qwen2.py's; in the model's tree every leaf has a leading [L] (the layer stack).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

Arr = TypeVar("Arr", np.ndarray, jax.Array)
Reader = Callable[[tuple[slice, ...] | None], np.ndarray]


class Fused(NamedTuple):
    module: str  # the parent module of the projections ("self_attn", "mlp")
    name: str  # the fused projection
    parts: tuple[str, ...]  # the separate projections it holds, in order along the part axis
    grouped: bool  # the part axis sits inside the kv-head axis ([..., K, G + 2, H]); else [..., 2, F]


FUSED: tuple[Fused, ...] = (
    Fused("self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj"), True),
    Fused("mlp", "gate_up_proj", ("gate_proj", "up_proj"), False),
)


def _concat(parts: Sequence[Arr], axis: int) -> Arr:
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts, axis=axis)
    return jnp.concatenate(parts, axis=axis)


def fuse_leaf(parts: Sequence[Arr], grouped: bool, kv_heads: int) -> Arr:
    """The separate projections' leaves ([..., K * X * H] or [..., F] each) as one fused leaf."""
    if not grouped:
        return _concat([p.reshape(*p.shape[:-1], 1, p.shape[-1]) for p in parts], axis=-2)
    H = parts[-1].shape[-1] // kv_heads  # the key projection: one head per kv head
    return _concat([p.reshape(*p.shape[:-1], kv_heads, -1, H) for p in parts], axis=-2)


def fused_shape(part_shapes: Sequence[tuple[int, ...]], grouped: bool, kv_heads: int) -> tuple[int, ...]:
    """The shape `fuse_leaf` gives for parts of these shapes."""
    *lead, last = part_shapes[-1]
    if not grouped:
        return (*lead, len(part_shapes), last)
    H = last // kv_heads
    return (*lead, kv_heads, sum(s[-1] // (kv_heads * H) for s in part_shapes), H)


def part_widths(fused_shape: Sequence[int], fused: Fused) -> tuple[int, ...]:
    """How many rows of the part axis each separate projection takes: (G, 1, 1) for q|k|v, (1, 1) for gate|up."""
    if fused.grouped:
        return (fused_shape[-2] - 2, 1, 1)
    return (1,) * len(fused.parts)


def unfuse_leaf(x: Arr, fused: Fused) -> list[Arr]:
    """`fuse_leaf` undone: the separate projections' leaves."""
    out: list[Arr] = []
    start = 0
    for width in part_widths(x.shape, fused):
        part = x[..., start : start + width, :]
        start += width
        lead = x.shape[:-3] if fused.grouped else x.shape[:-2]
        out.append(part.reshape(*lead, -1))
    return out


def _is_mapping(x: object) -> bool:
    return isinstance(x, Mapping)


def _convert(tree: object, at_dict: Callable[[dict[str, object]], dict[str, object]]) -> object:
    """`tree` with every dict (innermost first) replaced by `at_dict(dict)`: params, and the optimizer state's
    per-parameter trees (Adam's moments) inside optax's tuples."""
    if isinstance(tree, Mapping):
        return at_dict({str(k): _convert(v, at_dict) for k, v in tree.items()})
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a NamedTuple (optax's states)
        make: Callable[..., object] = type(tree)
        return make(*[_convert(v, at_dict) for v in tree])
    if isinstance(tree, (tuple, list)):
        return type(tree)(_convert(v, at_dict) for v in tree)
    return tree


def fuse_tree(tree: object, kv_heads: int) -> object:
    """A parameter tree (or any tree holding parameter trees) of the separate projections in the fused layout."""

    def at_dict(node: dict[str, object]) -> dict[str, object]:
        for f in FUSED:
            if not all(_is_mapping(node.get(p)) for p in f.parts):
                continue
            parts = [node.pop(p) for p in f.parts]
            leaves = {
                key: fuse_leaf([p[key] for p in parts], f.grouped, kv_heads)  # type: ignore[index]
                for key in parts[0]  # type: ignore[attr-defined]
            }
            node[f.name] = leaves
        return node

    return _convert(tree, at_dict)


def unfuse_tree(tree: object, split_leaf: Callable[[object, Fused], list[object]] | None = None) -> object:
    """`fuse_tree` undone: the separate projections, as Hugging Face stores them. `split_leaf` splits one fused
    leaf (default: an array's `unfuse_leaf`; `unfuse_struct` for a tree of ShapeDtypeStructs)."""
    split_one = split_leaf or unfuse_leaf

    def at_dict(node: dict[str, object]) -> dict[str, object]:
        for f in FUSED:
            fused = node.get(f.name)
            if not isinstance(fused, Mapping):
                continue
            del node[f.name]
            split = {key: split_one(leaf, f) for key, leaf in fused.items()}
            for i, p in enumerate(f.parts):
                node[p] = {key: parts[i] for key, parts in split.items()}
        return node

    return _convert(tree, at_dict)


def unfuse_struct(x: object, fused: Fused) -> list[object]:
    """`unfuse_leaf` for a ShapeDtypeStruct: each part's shape, sharded like the fused leaf without its part
    axis (a kv-head split becomes a split of the part's K * X * H columns by whole kv heads)."""
    assert isinstance(x, jax.ShapeDtypeStruct), type(x)
    shapes = [p.shape for p in jax.eval_shape(lambda a: unfuse_leaf(a, fused), x)]
    placement = x.sharding
    if isinstance(placement, jax.sharding.NamedSharding):
        spec = tuple(placement.spec) + (None,) * (len(x.shape) - len(placement.spec))
        kept = spec[:-2] if fused.grouped else (*spec[:-2], spec[-1])
        placement = jax.sharding.NamedSharding(placement.mesh, jax.sharding.PartitionSpec(*kept))
    return [jax.ShapeDtypeStruct(s, x.dtype, sharding=placement) for s in shapes]


def fused_path(path: str) -> tuple[str, Fused, int] | None:
    """(the fused leaf's path, its Fused row, the part's index) for a separate projection's "/"-joined path."""
    for f in FUSED:
        for i, p in enumerate(f.parts):
            marker = f"/{f.module}/{p}/"
            if marker in path:
                return path.replace(marker, f"/{f.module}/{f.name}/"), f, i
    return None


def _bounds(index: slice, dim: int) -> tuple[int, int]:
    r = range(dim)[index]
    return r.start, r.stop


def fused_reader(shape: tuple[int, ...], fused: Fused, readers: Sequence[Reader]) -> Reader:
    """Read a block of a fused leaf of `shape` from the separate projections' readers (each: a block of its own
    leaf by index, None for the whole): a device reads only the kv heads or MLP columns its shard holds."""

    def read(index: tuple[slice, ...] | None) -> np.ndarray:
        index = index or (slice(None),) * len(shape)
        lead = index[:-3] if fused.grouped else index[:-2]
        if not fused.grouped:  # [..., 2, F]: the parts in this block, each with its columns
            first, stop = _bounds(index[-2], shape[-2])
            blocks = [readers[i]((*lead, index[-1])) for i in range(first, stop)]
            return np.concatenate([b[..., None, :] for b in blocks], axis=-2)
        k0, k1 = _bounds(index[-3], shape[-3])  # [..., K, G + 2, H]: whole kv heads of every part
        H = shape[-1]
        blocks = []
        for width, part in zip(part_widths(shape, fused), readers, strict=True):
            block = part((*lead, slice(k0 * width * H, k1 * width * H)))
            blocks.append(block.reshape(*block.shape[:-1], k1 - k0, width, H))
        return np.ascontiguousarray(np.concatenate(blocks, axis=-2)[..., index[-2], index[-1]])

    return read
