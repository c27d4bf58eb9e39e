"""Test-only, for every process the suite starts (it is on their PYTHONPATH): cheaper CPU compiles, and one JAX
compilation-cache key per CPU program in every process of a jax.distributed group.

**Cheaper CPU compiles.** The suite is CPU-bound and most of its CPU is XLA compiling the tiny model's programs for
the CPU. `XLA_FLAGS` gets `--xla_cpu_use_fusion_emitters=false --xla_llvm_disable_expensive_passes=true` (unless
already there): XLA's classic CPU fusion emitters and LLVM without its costliest passes. A cold 4-step toy run
costs about 20% less CPU with the same step lines to the last digit (docs/ci.md, "What the test settings save");
the programs run a little slower, which the tiny model does not notice. The product's own CPU runs keep XLA's
defaults. `TPUOPS_TESTS_XLA_DEFAULTS=1` leaves XLA_FLAGS alone.

**One cache key per CPU program.**

The suite's multi-process trainer runs (tests/trainer/test_train_processes.py, the emulated multi-worker VMs) put
this folder on PYTHONPATH and set `JAX_SHARE_BINARY_BETWEEN_HOSTS=1`: process 0 compiles each program the group
runs and the others load its binary instead of compiling the same program at the same moment (on 2 cores, 2-4
processes compiling the tiny model's programs at once were the suite's largest CPU cost after the TPU compiles).

JAX keys a program by, among others, its devices' topology fingerprint. On a TPU that is the slice's, the same on
every host, and sharing works as documented. A multi-process CPU client's fingerprint differs from process to
process (each sees its own), so each process waits for a key the first never writes: sharing hangs, and no process
but the first ever reads the persistent cache. This hashes a CPU program's devices by kind and global id instead
(what the fingerprint stands for on one machine); every other platform's key is JAX's own. Nothing is imported
until JAX itself imports `jax._src.cache_key`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

_MODULE = "jax._src.cache_key"
CHEAPER_CPU_COMPILES = ("--xla_cpu_use_fusion_emitters=false", "--xla_llvm_disable_expensive_passes=true")


def cheaper_cpu_compiles() -> None:
    """Append CHEAPER_CPU_COMPILES to XLA_FLAGS (tests/conftest.py calls it for the pytest process itself)."""
    if os.environ.get("TPUOPS_TESTS_XLA_DEFAULTS") == "1":
        return
    flags = os.environ.get("XLA_FLAGS", "").split()
    named = {f.split("=", 1)[0] for f in flags}
    flags += [f for f in CHEAPER_CPU_COMPILES if f.split("=", 1)[0] not in named]
    os.environ["XLA_FLAGS"] = " ".join(flags)


def _patch(module: ModuleType) -> None:
    own = getattr(module, "_hash_accelerator_config", None)
    if own is None or not hasattr(module, "_hash_string"):  # a JAX whose key this no longer knows: say so
        raise ImportError(
            f"tests/jax_share: {_MODULE} has no _hash_accelerator_config; update the test patch"
        )

    def _hash_accelerator_config(hash_obj: Any, accelerators: Any) -> None:
        devices = list(accelerators.flat)
        if devices and all(d.platform == "cpu" for d in devices):
            for d in devices:
                module._hash_string(hash_obj, f"{d.device_kind}:{d.id}")
        else:
            own(hash_obj, accelerators)

    module._hash_accelerator_config = _hash_accelerator_config  # type: ignore[attr-defined]


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if __name__ == "sitecustomize":  # at interpreter start; tests/conftest.py imports it only for the function
    sys.meta_path.insert(0, _PatchOnImport())
    cheaper_cpu_compiles()
