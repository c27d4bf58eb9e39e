"""The Flax model against transformers' PyTorch Qwen2ForCausalLM loaded from the same safetensors."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from trainer.model import qwen2
from trainer.model.loading import load_pretrained

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two rows: one full, one left-padded by 3; positions count real tokens only."""
    rng = np.random.default_rng(0)
    ids_BT = rng.integers(0, 151_665, size=(2, 12)).astype(np.int64)  # ids the real tokenizer can emit
    mask_BT = np.ones((2, 12), np.int64)
    mask_BT[1, :3] = 0
    positions_BT = np.maximum(np.cumsum(mask_BT, axis=1) - 1, 0)
    return ids_BT, mask_BT, positions_BT


@pytest.mark.parametrize("model_dir", ["tiny_model_dir", "tiny_untied_model_dir"])
def test_logits_match_transformers(model_dir: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(model_dir)
    config, params = load_pretrained(folder, dtype="float32")
    assert config.num_key_value_heads < config.num_attention_heads  # GQA
    bias = np.asarray(params["layers"]["self_attn"]["q_proj"]["bias"])
    assert np.abs(bias).max() > 0.01  # the biases are exercised, not zeros

    ref = transformers.Qwen2ForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    ref.eval()
    assert ref.config.tie_word_embeddings == config.tie_word_embeddings
    ids_BT, mask_BT, positions_BT = _inputs()
    with torch.no_grad():
        expected_BTV = ref(
            input_ids=torch.from_numpy(ids_BT),
            attention_mask=torch.from_numpy(mask_BT),
            position_ids=torch.from_numpy(positions_BT),
        ).logits.numpy()

    got_BTV = np.asarray(
        qwen2.forward_logits(
            params, config, jnp.asarray(ids_BT), jnp.asarray(positions_BT), jnp.asarray(mask_BT)
        )
    )
    real_BT = mask_BT.astype(bool)  # padded query rows are garbage in both implementations
    diff = np.abs(got_BTV[real_BT] - expected_BTV[real_BT]).max()
    assert diff < 1e-4, f"max abs logit difference {diff}"
    assert np.abs(expected_BTV[real_BT]).max() > 0.5  # the comparison is not between near-zero logits
