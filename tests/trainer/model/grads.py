"""One comparison of two parameter-gradient trees, shared by the model tests."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def assert_grads_close(got: Any, want: Any, tol: float) -> None:
    """Every leaf of `got` within `tol` of its largest gradient in `want`, and every leaf of `want` non-zero."""
    flat_want = jax.tree_util.tree_leaves_with_path(want)
    for (path, w), g in zip(flat_want, jax.tree_util.tree_leaves(got), strict=True):
        scale = float(np.abs(np.asarray(w)).max())
        assert scale > 0, f"{jax.tree_util.keystr(path)}: no gradient"
        err = float(np.abs(np.asarray(g) - np.asarray(w)).max()) / scale
        assert err <= tol, (
            f"{jax.tree_util.keystr(path)}: error {err:.2e} of its largest gradient {scale:.3g}"
        )
