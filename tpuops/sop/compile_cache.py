"""JAX's persistent compilation cache for a job: what `compile_cache` (auto, off, a folder, gs://...) exports."""

from __future__ import annotations

import posixpath

from tpuops import shell
from tpuops.errors import UsageError

VAR = "JAX_COMPILATION_CACHE_DIR"  # read by JAX itself at import (jax_compilation_cache_dir)
FOLDER = "jax-cache"  # `auto`'s folder, beside the checkout: in the repository's home on the worker


def default_dir(cwd: str) -> str:
    """`auto`'s cache: `jax-cache` beside the job's checkout (`~/tpuops/<repo>-<hash>/jax-cache` for the
    default checkout), else `~/tpuops/jax-cache`."""
    parent = posixpath.dirname(cwd.rstrip("/")) if cwd else ""
    if parent in ("", "/", "~", "."):
        parent = "~/tpuops"
    return f"{parent}/{FOLDER}"


def export(value: str, cwd: str) -> str:
    """Shell text (ending in `;`) that sets the job's JAX_COMPILATION_CACHE_DIR, run after its .env is read.

    auto: a cache the worker's environment or the .env already names is kept, else `default_dir(cwd)`;
    off: none (the variable is unset); anything else: that folder or gs:// URL, whatever the .env says."""
    v = value.strip()
    if v == "off":
        return f"unset {VAR};"
    if v == "auto":
        return f'[ -n "${{{VAR}:-}}" ] || {VAR}={shell.path(default_dir(cwd))}; export {VAR};'
    if not v:
        raise UsageError(
            f"compile_cache must be auto, off, a folder or gs://BUCKET/PATH, received {value!r}",
            hint="for example --set compile_cache=gs://my-bucket/jax-cache",
        )
    return f"{VAR}={shell.path(v)}; export {VAR};"
