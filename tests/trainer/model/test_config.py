"""Qwen2Config: presets equal the real Qwen2.5 configs, HF round trip, validation messages."""

from __future__ import annotations

import json

import pytest

from tests.data import DATA
from trainer.model.config import PRESETS, Qwen2Config, preset

CONFIGS = DATA / "qwen2.5-configs"
SHAPE_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "rope_theta", "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings",
)  # fmt: skip


@pytest.mark.parametrize("size", ["0.5b", "1.5b", "3b", "7b"])
def test_presets_equal_the_real_configs(size: str) -> None:
    hf = json.loads((CONFIGS / f"Qwen2.5-{size.upper()}-Instruct.json").read_text())
    real = Qwen2Config.from_hf(hf)
    mine = preset(f"qwen2.5-{size}")
    assert {f: getattr(mine, f) for f in SHAPE_FIELDS} == {f: getattr(real, f) for f in SHAPE_FIELDS}
    assert mine.head_dim == hf["hidden_size"] // hf["num_attention_heads"] == 128 or size == "0.5b"


def test_tiny_presets_cover_the_tokenizer_and_differ_in_tying() -> None:
    assert PRESETS["tiny"].vocab_size >= 151_665 and PRESETS["tiny"].tie_word_embeddings
    assert not PRESETS["tiny-untied"].tie_word_embeddings
    assert PRESETS["tiny"].num_key_value_heads < PRESETS["tiny"].num_attention_heads


def test_hf_round_trip_keeps_every_field_and_rope_scaling() -> None:
    config = PRESETS["tiny"].replace(
        rope_scaling=(("factor", 2.0), ("rope_type", "linear")), param_dtype="float32"
    )
    back = Qwen2Config.from_hf(config.to_hf(), dtype=config.dtype)
    assert back == config and back.rope_factor == 2.0
    v5_style = {**config.to_hf(), "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}
    del v5_style["rope_theta"], v5_style["rope_scaling"]
    assert (
        Qwen2Config.from_hf(v5_style).rope_theta == 5e5 and Qwen2Config.from_hf(v5_style).rope_scaling is None
    )


def test_unknown_preset_names_close_matches() -> None:
    with pytest.raises(ValueError, match=r"did you mean qwen2\.5-3b"):
        preset("qwen2.5-3")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_attention_heads": 5}, "divisible by num_attention_heads, received 64 and 5"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads, received 4 and 3"),
        ({"dtype": "fp8"}, "received 'fp8'"),
        ({"rope_scaling": (("rope_type", "yarn"),)}, "received 'yarn'"),
    ],
)
def test_validation_says_what_it_received(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PRESETS["tiny"].replace(**changes)
