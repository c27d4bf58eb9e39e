"""What JAX's persistent compilation cache gave this process: programs loaded from it and compile seconds saved."""

from __future__ import annotations

import threading

import jax
from jax import monitoring

# JAX's own events (jax/_src/compiler.py): one per program read from the persistent cache, and the compile time
# that program had cost minus the time the read took.
HIT = "/jax/compilation_cache/cache_hits"
SAVED = "/jax/compilation_cache/compile_time_saved_sec"


class CacheCounter:
    """Counts JAX's cache events from `watch()` on (the listeners stay registered for the process)."""

    def __init__(self) -> None:
        self.hits = 0
        self.saved_s = 0.0
        self._lock = threading.Lock()

    def _event(self, event: str, **_: str | int) -> None:
        if event == HIT:
            with self._lock:
                self.hits += 1

    def _duration(self, event: str, duration_secs: float, **_: str | int) -> None:
        if event == SAVED:
            with self._lock:
                self.saved_s += duration_secs

    def summary(self) -> dict[str, object]:
        """The summary line's fields: where the cache is (`off` without one), programs read, seconds saved."""
        cfg = jax.config  # typed without its flags: read them by name
        on = getattr(cfg, "jax_enable_compilation_cache", True)
        where = getattr(cfg, "jax_compilation_cache_dir", None) if on else None
        if not where:
            return {"compile_cache": "off"}
        return {"compile_cache_hits": self.hits, "compile_cache_saved_s": round(self.saved_s, 3)}


COUNTER = CacheCounter()
_watching = False


def watch() -> CacheCounter:
    """Start counting (once per process) and return the counter."""
    global _watching
    if not _watching:
        monitoring.register_event_listener(COUNTER._event)
        monitoring.register_event_duration_secs_listener(COUNTER._duration)
        _watching = True
    return COUNTER
