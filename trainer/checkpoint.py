"""Orbax checkpoints (local path or gs://): parameters, optimizer state, step and data position."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax


def _path(directory: str) -> Any:
    if directory.startswith("gs://"):
        from etils import epath

        return epath.Path(directory)
    return Path(directory).expanduser().absolute()


def manager(directory: str) -> Any:
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=3, create=True)
    return ocp.CheckpointManager(_path(directory), options=options)


def save(mgr: Any, step: int, state: dict[str, Any], meta: dict[str, Any]) -> None:
    """Checkpoint `step` = the number of completed steps (a resumed run starts at this step)."""
    import orbax.checkpoint as ocp

    mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
    mgr.wait_until_finished()


def restore_latest(mgr: Any, like: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
    """(step, state, meta) of the latest checkpoint, placed like `like` (shapes and shardings); None if none."""
    import orbax.checkpoint as ocp

    step = mgr.latest_step()
    if step is None:
        return None
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), like
    )
    got = mgr.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
    )
    return step, got["state"], got["meta"]
