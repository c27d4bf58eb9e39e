"""The decode layout's fused projections and their conversion from and to Hugging Face's separate ones.

The decode's copy of the weights (trainer.layout.decode_layout) holds q|k|v as one weight and gate|up as another,
so that each is one matmul (one read of the activations, one kernel launch per layer and token instead of three
or two):
  self_attn/qkv_proj: kernel [D, K, G + 2, H], bias [K, G + 2, H]: for each kv head k its G query heads (query
    head n = k * G + g, Hugging Face's order), then its key head, then its value head;
  mlp/gate_up_proj:   kernel [D, 2, F]: the gate's columns, then the up projection's.
The part axis (G + 2, 2) is never split: split over tp along K, each device holds whole kv heads with their own
query heads; along F, matching gate and up columns (trainer/sharding.py). Concatenated along the split axis
instead, a device's slice would hold, e.g., only query heads.
Training keeps the separate projections (checkpoints, Hugging Face export and the update unchanged): fused in the
update too, the TPU compile of the seed's update read 50 GB more HBM and peaked 3.3 GB higher
(docs/performance.md, "Choices the compiles decided").
Dims as trainer/model/qwen2.py's; in the model's tree every leaf has a leading [L] (the layer stack).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np

Arr = TypeVar("Arr", np.ndarray, jax.Array)
Tree = TypeVar("Tree")


class Fused(NamedTuple):
    module: str  # the parent module of the projections ("self_attn", "mlp")
    name: str  # the fused projection
    parts: tuple[str, ...]  # the separate projections it holds, in order along the part axis
    grouped: bool  # the part axis sits inside the kv-head axis ([..., K, G + 2, H]); else [..., 2, F]


FUSED: tuple[Fused, ...] = (
    Fused("self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj"), True),
    Fused("mlp", "gate_up_proj", ("gate_proj", "up_proj"), False),
)


def is_fused(params: Mapping[str, object]) -> bool:
    """Whether a model's parameters (stacked layers, or `unrolled.unstack_layers`' tuple of layers) are in the
    fused layout: what the model's functions run."""
    layers = params["layers"]
    first = layers[0] if isinstance(layers, (tuple, list)) else layers
    return isinstance(first, Mapping) and "qkv_proj" in first.get("self_attn", {})


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
    """`tree` with every dict (innermost first) replaced by `at_dict(dict)`, through tuples, lists and
    NamedTuples (a tree that holds parameter trees, as optax's states do)."""
    if isinstance(tree, Mapping):
        return at_dict({str(k): _convert(v, at_dict) for k, v in tree.items()})
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a NamedTuple (optax's states)
        make: Callable[..., object] = type(tree)
        return make(*[_convert(v, at_dict) for v in tree])
    if isinstance(tree, (tuple, list)):
        return type(tree)(_convert(v, at_dict) for v in tree)
    return tree


def fuse_tree(tree: Tree, kv_heads: int) -> Tree:
    """A parameter tree (or any tree holding parameter trees) of the separate projections in the fused layout
    (the same kind of container, with new leaves)."""

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

    return cast(Tree, _convert(tree, at_dict))


def unfuse_tree(tree: Tree) -> Tree:
    """`fuse_tree` undone: the separate projections, as Hugging Face stores them."""

    def at_dict(node: dict[str, object]) -> dict[str, object]:
        for f in FUSED:
            fused = node.get(f.name)
            if not isinstance(fused, Mapping):
                continue
            del node[f.name]
            split = {key: unfuse_leaf(leaf, f) for key, leaf in fused.items()}
            for i, p in enumerate(f.parts):
                node[p] = {key: parts[i] for key, parts in split.items()}
        return node

    return cast(Tree, _convert(tree, at_dict))
