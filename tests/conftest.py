"""Session-wide test settings: JAX on CPU with 8 forced host devices (set before anything imports JAX)."""

from __future__ import annotations

import os

# Sharding tests need 8 devices; everything else runs on device 0 of the same 8. These must be set before
# the first `import jax` anywhere in the session, so they live at the top of the root conftest.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("WANDB_MODE", "offline")
# Offline W&B still probes endpoints (stats, CoreWeave metadata, error reports): point them at a closed port.
for _name, _value in {
    "WANDB_BASE_URL": "http://127.0.0.1:1",
    "WANDB__STATS_COREWEAVE_METADATA_BASE_URL": "http://127.0.0.1:1",
    "WANDB_X_DISABLE_STATS": "true",
    "WANDB_ERROR_REPORTING": "false",
}.items():
    os.environ.setdefault(_name, _value)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# ---- the fast tier: `pytest -m "not slow"` (docs/ci.md) ----
# Slow, besides tests marked @pytest.mark.slow themselves: every test that starts real sshd workers, the TPU
# API emulator or a worker interpreter (by the fixtures it uses), and the modules that compile JAX programs
# or run the trainer. They all still run in CI; the fast tier is the inner loop (in-memory transport,
# loader, config, scanner, reports).
SLOW_FIXTURES = frozenset({"sshd_pool", "cloud", "cloud_session", "worker_python", "committed_repo"})
SLOW_MODULES = (
    "tests/trainer/kernels/",
    "tests/trainer/model/test_qwen2.py",
    "tests/trainer/model/test_hf_equivalence.py",
    "tests/trainer/model/test_loading.py",
    "tests/trainer/sampling/",
    "tests/trainer/fit/test_fit.py",
    "tests/trainer/grpo/test_loss.py",
    "tests/trainer/test_train.py",
    "tests/trainer/test_train_processes.py",
    "tests/trainer/test_eval.py",
    "tests/trainer/test_wandb.py",
    "tests/trainer/test_checkpoint_gcs.py",
    "tests/trainer/test_sharding.py",
    "tests/trainer/test_hub.py",
    "tests/trainer/test_make_tiny.py",
    "tests/tpuops/test_e2e_local.py",
    "tests/tpuops/checks/test_fit.py",
)


def pytest_collection_modifyitems(config: object, items: list) -> None:
    import pytest

    slow = pytest.mark.slow
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())) or item.nodeid.startswith(
            SLOW_MODULES
        ):
            item.add_marker(slow)
