"""The statuses a step outcome can have (light: the renderers import it without pydantic)."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """Every status an outcome can have: the renderers style each one, and a test renders them all."""

    CHANGED = "changed"
    NOTHING = "nothing"
    OK = "ok"
    FAILED = "failed"
    BUSY = "busy"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    HANG = "hang"
    DETACHED = "detached"  # Ctrl-C: following stopped, the job goes on


# The statuses that count as a failure of the step.
FAILED = frozenset({Status.FAILED, Status.BUSY, Status.TIMEOUT, Status.CANCELLED, Status.HANG})
