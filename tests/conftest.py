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
