"""Tile sizes for the log-prob kernels: a frozen dataclass that checks itself, and tuned sizes keyed by device.

`rows` is the token-row tile (flattened batch x tokens), `vocab` the vocabulary tile. The vocabulary need not
be a multiple of `vocab` (151936 = 128 x 1187 has no other 128-multiple divisor): the last tile is ragged
and masked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import jax.numpy as jnp

LANES = 128  # TPU vector lane width: vocab tiles are multiples of it
SUBLANES = {4: 8, 2: 16}  # rows per packed sublane tile by itemsize: float32 8, bfloat16 16


@dataclass(frozen=True)
class BlockSizes:
    """Row and vocab tile sizes; rows a multiple of 8 (16 for 16-bit logits), vocab a multiple of 128."""

    rows: int = 256
    vocab: int = 2048

    def __post_init__(self) -> None:
        if self.rows <= 0 or self.rows % 8:
            raise ValueError(f"BlockSizes.rows must be a positive multiple of 8, received {self.rows}")
        if self.vocab <= 0 or self.vocab % LANES:
            raise ValueError(
                f"BlockSizes.vocab must be a positive multiple of {LANES}, received {self.vocab}"
            )

    def check_dtype(self, dtype: jnp.dtype) -> BlockSizes:
        """Raise if `rows` does not fill whole sublane tiles of `dtype`; return self."""
        sub = SUBLANES.get(jnp.dtype(dtype).itemsize, 8)
        if self.rows % sub:
            raise ValueError(
                f"BlockSizes.rows must be a multiple of {sub} for {jnp.dtype(dtype).name} logits, "
                f"received {self.rows}"
            )
        return self


# Measured on this project's CPU runner (bench/bench_kernels.py, docs/performance.md). The TPU rows
# are reasoned defaults, not yet measured on hardware: a (256, 2048) bf16 tile is 1 MiB, its float32
# temporaries 2 MiB each, well inside v5e/v6e scoped VMEM with double buffering.
TUNED: dict[str, dict[str, BlockSizes]] = {
    "cpu": {
        "chunked": BlockSizes(rows=128, vocab=2048),
        "fused_lm_head": BlockSizes(rows=256, vocab=8192),
        "pallas": BlockSizes(rows=16, vocab=256),
    },
    "tpu": {
        "chunked": BlockSizes(rows=256, vocab=2048),
        "fused_lm_head": BlockSizes(rows=512, vocab=4096),
        "pallas": BlockSizes(rows=256, vocab=2048),
    },
    "gpu": {
        "chunked": BlockSizes(rows=256, vocab=2048),
        "fused_lm_head": BlockSizes(rows=512, vocab=4096),
        "pallas": BlockSizes(rows=256, vocab=2048),
    },
}


# Device-kind substrings (lower case) -> TUNED key; jax reports e.g. "TPU v6 lite", "NVIDIA H100 80GB HBM3".
KIND_KEYS = (("tpu", "tpu"), ("nvidia", "gpu"), ("gpu", "gpu"), ("amd", "gpu"), ("cpu", "cpu"))


_TARGET: list[str] = []  # the device kind an ahead-of-time compile is for (trainer.fit), innermost last


@contextmanager
def compile_target(device_kind: str) -> Iterator[None]:
    """Pick kernels and tile sizes for `device_kind` (e.g. "tpu TPU v6 lite") instead of this process's devices:
    an ahead-of-time compile for a TPU topology on a CPU machine lowers the real Mosaic kernels."""
    _TARGET.append(device_kind)
    try:
        yield
    finally:
        _TARGET.pop()


def device_kind() -> str:
    """ "platform kind" of the devices kernels are built for: the compile target, else jax.devices()[0]."""
    if _TARGET:
        return _TARGET[-1]
    import jax

    return f"{jax.devices()[0].platform} {jax.devices()[0].device_kind}"


def on_gpu() -> bool:
    """Whether kernels are built for a GPU: this process's devices, or a GPU compile target."""
    return device_kind().lower().startswith(("gpu", "cuda"))


def for_device(impl: str, device_kind_: str | None = None) -> BlockSizes:
    """Tuned sizes for `impl` on a device kind (default: `device_kind()`); unknown kinds get CPU sizes."""
    kind = (device_kind_ or device_kind()).lower()
    key = next((k for sub, k in KIND_KEYS if sub in kind), "cpu")
    return TUNED[key][impl]
