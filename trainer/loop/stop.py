"""SIGTERM (a preemption notice, `tpuops stop`) ends the run at a step boundary, after a checkpoint."""

from __future__ import annotations

import signal
import threading
from typing import Any


class StopNotice:
    """Whether a stop was asked for, agreed by every process.

    Multi-host: JAX's preemption service catches SIGTERM and every process agrees on the step to stop at
    (multihost_utils.reached_preemption_sync_point, asked after every step). One process: a handler sets a flag.
    """

    def __init__(self, process_count: int) -> None:
        self.multi = process_count > 1
        self.flag = False
        self.previous: Any = None
        if not self.multi and threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._on_term)

    def close(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None

    def _on_term(self, signum: int, frame: Any) -> None:
        self.flag = True

    def reached(self, done: int) -> bool:
        if not self.multi:
            return self.flag
        from jax.experimental import multihost_utils

        try:
            return multihost_utils.reached_preemption_sync_point(done)
        except RuntimeError:  # the preemption service is off (jax_enable_preemption_service)
            return False
