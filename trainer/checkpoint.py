"""Orbax checkpoints (local path or gs://): parameters, optimizer state, step and data position.

No JAX at import: the entry point checks a gs:// directory (gcsfs, credentials) before loading anything."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class CheckpointAccessError(RuntimeError):
    """The checkpoint directory cannot be used at all (no gs:// filesystem, no credentials): one line."""


def _path(directory: str) -> Any:
    if directory.startswith("gs://"):
        from etils import epath

        gcs_ready(directory)
        return epath.Path(directory)
    return Path(directory).expanduser().absolute()


def gcs_ready(directory: str) -> None:
    """Check what a gs:// checkpoint needs before the first save: gcsfs (orbax's metadata goes through it,
    the arrays through tensorstore) and credentials. STORAGE_EMULATOR_HOST (a local GCS-compatible server, as
    google-cloud-storage and gcsfs read it) stands in for both the endpoint and the credentials."""
    try:
        import gcsfs  # noqa: F401 - etils' gs:// paths need it, and say so only at the first write
    except ImportError:
        raise CheckpointAccessError(
            f"checkpoint.dir {directory} needs gcsfs, which is not installed (pip install -e '.[trainer]')"
        ) from None
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", emulator)  # the arrays go to the same server
        # An emulator checks no token; without one, tensorstore looks for credentials (a metadata server
        # probed with retries) before every first request.
        os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
        return
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        google.auth.default()
    except DefaultCredentialsError:
        raise CheckpointAccessError(
            f"checkpoint.dir {directory}: no Google Cloud credentials found (GOOGLE_APPLICATION_CREDENTIALS is "
            "unset, no `gcloud auth application-default login`, no VM metadata server); on a TPU VM the VM's "
            "service account needs storage access, elsewhere set GOOGLE_APPLICATION_CREDENTIALS"
        ) from None


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
    import jax
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
