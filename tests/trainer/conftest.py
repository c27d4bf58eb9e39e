"""Trainer test fixtures: seeded tiny Qwen2 checkpoints written by trainer.make_tiny, the real tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data import DATA


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    path = DATA / "qwen2.5-tokenizer"
    assert (path / "tokenizer.json").exists(), f"missing test data: {path}"
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """The `tiny` preset (tied embeddings), seed 0, in HF format with the tokenizer files."""
    from trainer.make_tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny"), "tiny", 0, tokenizer_dir=tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_untied_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """The `tiny-untied` preset (separate lm_head), seed 1."""
    from trainer.make_tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny-untied"), "tiny-untied", 1, tokenizer_dir=tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_f32(tiny_model_dir: Path) -> tuple:
    """(config, params) of the tiny checkpoint loaded with float32 compute on device 0."""
    from trainer.model.loading import load_pretrained

    return load_pretrained(tiny_model_dir, dtype="float32")


@pytest.fixture(scope="session")
def prompts() -> tuple:
    """Four left-padded prompts of real-vocabulary ids in a bucket of 8: (ids_BP, mask_BP) int32."""
    import numpy as np

    rng = np.random.default_rng(7)
    ids = rng.integers(0, 151_665, size=(4, 8)).astype(np.int32)
    mask = np.ones((4, 8), np.int32)
    mask[1, :3] = 0
    mask[2, :6] = 0
    mask[3, :1] = 0
    ids[mask == 0] = 151_643
    return ids, mask
