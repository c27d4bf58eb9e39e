"""Trainer test fixtures: seeded tiny Qwen2 checkpoints written by trainer.make_tiny, the real tokenizer."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.data import DATA

COMPILE_LOGGING = ("jax_log_compiles", "jax_explain_cache_misses")


@pytest.fixture(autouse=True)
def _compile_logging_put_back() -> Iterator[None]:
    """`log.log_compiles=true` turns on JAX's compile logging and its explanation of tracing-cache misses for the
    whole process (trainer.startup.setup_jax): right for a trainer process, but an in-process test must not
    leave them on for the tests after it in the same worker. An explanation walks every key of the process's
    tracing cache, so with them left on, each later test paid for every earlier one's traces."""
    jax = sys.modules.get("jax")
    before = {name: getattr(jax.config, name) for name in COMPILE_LOGGING} if jax else {}
    yield
    if (jax := sys.modules.get("jax")) is not None:
        for name in COMPILE_LOGGING:
            jax.config.update(name, before.get(name, False))


def empty_tracing_cache() -> None:
    """Drop this process's in-memory JAX caches before a test that turns on `log.log_compiles`: each tracing-cache
    miss is then explained against every key of that cache, and an xdist worker that ran other tests first holds
    thousands (test_eval's run: 37 s of CPU there against 6 s alone). The persistent compilation cache stays."""
    import jax

    jax.clear_caches()


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
