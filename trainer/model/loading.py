"""Load and save Hugging Face Qwen2 folders (config.json + safetensors, single file or sharded index).

`load_pretrained` reads tensors with `safetensors` (no torch) straight into sharded jax Arrays: each
device's shard is sliced out of the file by `jax.make_array_from_callback`, so a process reads only the
bytes its own devices hold. A `path_or_repo_id` that is not a local folder is fetched with
huggingface_hub (only on machines with internet). `save_pretrained` writes a folder that transformers'
`Qwen2ForCausalLM.from_pretrained` loads.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from trainer import sharding
from trainer.model import params as name_map
from trainer.model.config import Qwen2Config

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def resolve_path(path_or_repo_id: str | Path) -> Path:
    """A local folder as is (`~` expanded); otherwise download the repo's config, weights and tokenizer files."""
    path = Path(path_or_repo_id).expanduser()
    if path.is_dir():
        return path
    if path.exists() or str(path_or_repo_id).startswith((".", "/", "~")):
        raise FileNotFoundError(f"model_path {str(path_or_repo_id)!r} is not a folder")
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "merges.txt", "vocab.json", "tokenizer*"]
    return Path(snapshot_download(str(path_or_repo_id), allow_patterns=patterns))


def _weight_files(folder: Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file that holds it."""
    if (folder / INDEX).exists():
        weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    if (folder / SINGLE).exists():
        with safe_open(folder / SINGLE, "np") as f:
            return dict.fromkeys(f.keys(), folder / SINGLE)
    raise FileNotFoundError(f"{folder} has neither {SINGLE} nor {INDEX}")


def _block(tensor: Any, index: tuple[slice, ...], transpose: bool, dtype: Any) -> np.ndarray:
    """The `index` block of one HF tensor in Flax orientation (a transposed tensor is sliced transposed)."""
    block = tensor[index[::-1]].T if transpose else tensor[index]
    return np.ascontiguousarray(block).astype(dtype)


def load_pretrained(
    path_or_repo_id: str | Path,
    *,
    mesh: Mesh | None = None,
    dtype: str | None = None,
    param_dtype: str | None = None,
) -> tuple[Qwen2Config, dict[str, Any]]:
    """(config, params): params sharded over `mesh` by trainer.sharding's rules, else on device 0.

    `dtype` overrides the compute dtype, `param_dtype` the stored dtype of the loaded parameters."""
    folder = resolve_path(path_or_repo_id)
    overrides = {k: v for k, v in {"dtype": dtype, "param_dtype": param_dtype}.items() if v is not None}
    config = Qwen2Config.from_hf(json.loads((folder / "config.json").read_text()), **overrides)
    files = _weight_files(folder)
    missing = sorted(name_map.expected_hf_names(config) - set(files))
    if missing:
        raise KeyError(f"checkpoint {folder} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    target = jnp.dtype(config.param_dtype)
    # Flax leaf -> its HF tensors (one per layer, in layer order, for a stacked layer leaf) and transpose.
    leaves: dict[str, tuple[list[str], bool]] = {}
    for name in sorted(name_map.expected_hf_names(config)):
        path, layer, transpose = name_map.hf_to_flax(name)  # type: ignore[misc]
        names, _ = leaves.setdefault(
            path, ([""] * (config.num_hidden_layers if layer is not None else 1), transpose)
        )
        names[layer or 0] = name
    params: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        handles = {p: stack.enter_context(safe_open(p, "np")) for p in set(files.values())}
        for path, (names, transpose) in leaves.items():
            tensors = [handles[files[name]].get_slice(name) for name in names]
            hf_shape = tuple(tensors[0].get_shape())
            shape = hf_shape[::-1] if transpose else hf_shape
            stacked = name_map.is_stacked(path)
            if stacked:
                shape = (len(tensors), *shape)
            placement: jax.sharding.Sharding
            if mesh is None:
                placement = SingleDeviceSharding(jax.local_devices()[0])
            else:
                placement = jax.sharding.NamedSharding(
                    mesh, sharding.param_spec(path, shape, mesh, sharding.head_counts(config))
                )

            def read(index: tuple[slice, ...] | None, tensors: list[Any] = tensors, stacked: bool = stacked,
                     transpose: bool = transpose, rank: int = len(shape)) -> np.ndarray:  # fmt: skip
                index = index or (slice(None),) * rank  # None: the whole array (jax's callback contract)
                if not stacked:
                    return _block(tensors[0], index, transpose, target)
                rows = range(len(tensors))[index[0]]  # this shard's layers, each sliced like the 2-D tensor
                return np.stack([_block(tensors[i], index[1:], transpose, target) for i in rows])

            node = params
            *parents, leaf = path.split("/")
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = jax.make_array_from_callback(shape, placement, read)
    return config, params


def _host_numpy(x: jax.Array) -> np.ndarray:
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def save_pretrained(
    config: Qwen2Config,
    params: dict[str, Any],
    out_dir: str | Path,
    *,
    max_shard_bytes: int = 4 << 30,
    every_process: bool = False,
) -> Path:
    """Write config.json and model.safetensors (or shards + index when over max_shard_bytes).

    Tensors are stored in config.param_dtype. Across processes every process must call this (the
    gather is collective); only process 0 writes, unless every_process (each to its own local folder)."""
    out = Path(out_dir)
    tensors: dict[str, np.ndarray] = {}
    for key_path, leaf in jax.tree_util.tree_leaves_with_path(params):
        path = sharding.path_str(key_path)
        array = _host_numpy(leaf).astype(jnp.dtype(config.param_dtype))
        rows = enumerate(array) if name_map.is_stacked(path) else [(None, array)]
        for layer, row in rows:
            name, transpose = name_map.flax_to_hf(path, layer)
            tensors[name] = np.ascontiguousarray(row.T if transpose else row)
    if jax.process_index() != 0 and not every_process:
        return out
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config.to_hf(), indent=2) + "\n")
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        if shards[-1] and size + tensors[name].nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += tensors[name].nbytes
    if len(shards) == 1:
        save_file(shards[0], out / SINGLE, metadata={"format": "pt"})
        return out
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, out / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.nbytes for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return out
