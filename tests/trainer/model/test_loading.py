"""Checkpoints: HF name table, save/load round trip (single file and sharded index), make_tiny CLI."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors import safe_open

from trainer.make_tiny import main as make_tiny_main
from trainer.model import params as name_map
from trainer.model.config import PRESETS
from trainer.model.loading import load_pretrained, save_pretrained
from trainer.sharding import path_str


def _flat(params: dict) -> dict[str, np.ndarray]:
    return {path_str(kp): np.asarray(v) for kp, v in jax.tree_util.tree_leaves_with_path(params)}


def test_name_table_round_trips_every_tensor() -> None:
    names = name_map.expected_hf_names(PRESETS["tiny-untied"])
    assert len(names) == 2 * 12 + 3
    for name in names:
        flax_path, layer, transpose = name_map.hf_to_flax(name)
        assert name_map.flax_to_hf(flax_path, layer) == (name, transpose)
        assert (layer is not None) == name_map.is_stacked(flax_path) == (".layers." in name)
    assert name_map.hf_to_flax("model.layers.1.mlp.up_proj.weight") == ("layers/mlp/up_proj/kernel", 1, True)
    assert name_map.hf_to_flax("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    with pytest.raises(KeyError, match="takes a layer index"):
        name_map.flax_to_hf("layers/mlp/up_proj/kernel")


def test_checkpoint_holds_hf_layout(tiny_model_dir: Path, tiny_f32: tuple) -> None:
    config, params = tiny_f32
    with safe_open(tiny_model_dir / "model.safetensors", "np") as f:
        assert set(f.keys()) == name_map.expected_hf_names(config)  # tied: no lm_head.weight
        q = f.get_tensor("model.layers.1.self_attn.q_proj.weight")
    np.testing.assert_array_equal(q.T, np.asarray(params["layers"]["self_attn"]["q_proj"]["kernel"][1]))
    assert json.loads((tiny_model_dir / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]


def test_sharded_index_round_trip_and_bf16(tiny_untied_model_dir: Path, tmp_path: Path) -> None:
    config, params = load_pretrained(tiny_untied_model_dir)
    out = save_pretrained(config, params, tmp_path / "sharded", max_shard_bytes=20 << 20)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 2 and all((out / f).exists() for f in files)
    config2, params2 = load_pretrained(out)
    assert config2 == config
    a, b = _flat(params), _flat(params2)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    _, half = load_pretrained(out, param_dtype="bfloat16")
    leaf = half["lm_head"]["kernel"]
    assert leaf.dtype == jax.numpy.bfloat16
    np.testing.assert_allclose(np.asarray(leaf, np.float32), a["lm_head/kernel"], rtol=1e-2)
    # a bf16 checkpoint (as the real Qwen2.5 ones are) loads into float32 master params
    bf16_dir = save_pretrained(config.replace(param_dtype="bfloat16"), params, tmp_path / "bf16")
    with safe_open(bf16_dir / "model.safetensors", "np") as f:
        assert f.get_slice("lm_head.weight").get_dtype() == "BF16"
    _, up = load_pretrained(bf16_dir, param_dtype="float32")
    assert up["lm_head"]["kernel"].dtype == jax.numpy.float32
    np.testing.assert_array_equal(np.asarray(up["lm_head"]["kernel"]), np.asarray(leaf, np.float32))


def test_missing_tensor_and_missing_folder_are_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    config, params = load_pretrained(tiny_model_dir)
    del params["layers"]["mlp"]  # every layer's 3 MLP weights
    save_pretrained(config, params, tmp_path)
    with pytest.raises(KeyError, match=rf"lacks {3 * config.num_hidden_layers} tensors"):
        load_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_pretrained(tmp_path / "nope")


def test_make_tiny_cli_is_seeded(tmp_path: Path, tiny_model_dir: Path, tokenizer_dir: Path) -> None:
    argv = [str(tmp_path / "again"), "--preset", "tiny", "--seed", "0", "--tokenizer", str(tokenizer_dir)]
    assert make_tiny_main(argv) == 0
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    assert make_tiny_main([str(tmp_path / "bad"), "--preset", "tiny-tied"]) == 1
