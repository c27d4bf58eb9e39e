"""Accelerator type -> host count: the documented examples and the errors for malformed types."""

from __future__ import annotations

import pytest

from tpuops.cloud.accelerators import KNOWN_HOSTS, worker_count
from tpuops.errors import UsageError


@pytest.mark.parametrize(("accel", "hosts"), sorted(KNOWN_HOSTS.items()))
def test_known_types(accel: str, hosts: int) -> None:
    assert worker_count(accel) == hosts


def test_documented_examples() -> None:
    # The slices users name most: one host up to 8 chips (v6e) or 8 cores (v4); v6e-16 is 4 hosts of 4 chips.
    assert [worker_count(t) for t in ("v4-8", "v4-16", "v6e-8", "v6e-16")] == [1, 2, 1, 4]


@pytest.mark.parametrize("bad", ["v6e", "v9-8", "v6e-x", "tpu-v4-8", ""])
def test_malformed_type_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="unknown accelerator type"):
        worker_count(bad)


def test_size_that_is_not_whole_hosts() -> None:
    with pytest.raises(UsageError, match="not a whole number of hosts"):
        worker_count("v6e-18")
