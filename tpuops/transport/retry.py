"""The one small retry helper for what the Google client libraries do not cover: SSH connects and log reads."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Waits between tries: `initial`, then times `factor` each time, never above `maximum`."""

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 10.0

    def delays(self) -> Iterator[float]:
        delay = self.initial
        while True:
            yield delay
            delay = min(delay * self.factor, self.maximum)


def retry(
    fn: Callable[[], T],
    *,
    on: tuple[type[BaseException], ...],
    backoff: Backoff,
    tries: int | None = None,
    until: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`fn()`, tried again after each exception in `on` until it returns; the last exception is raised once
    `tries` tries were made or the monotonic clock reached `until` (neither given: forever)."""
    for n, delay in enumerate(backoff.delays(), 1):
        try:
            return fn()
        except on:
            if (tries is not None and n >= tries) or (until is not None and time.monotonic() >= until):
                raise
            sleep(delay)
    raise AssertionError("unreachable: delays() never ends")
