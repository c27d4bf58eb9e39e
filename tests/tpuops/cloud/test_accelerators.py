"""Accelerator type -> host count: the documented examples and the errors for malformed types."""

from __future__ import annotations

import pytest

from tpuops.cloud.accelerators import KNOWN_HOSTS, parse, worker_count
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


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("v6e-18", "did you mean v6e-16? v6e sizes: 1, 4, 8, 16, 32, 64, 128, 256"),  # not whole hosts either
        ("v4-7", "did you mean v4-8? v4 sizes: 8, 16, 32"),
        ("v5litepod-2", "did you mean v5litepod-1?"),
    ],
)
def test_a_size_the_family_has_not_is_refused_naming_its_sizes(bad: str, says: str) -> None:
    with pytest.raises(UsageError, match="has no slice of") as e:
        worker_count(bad)
    assert says in (e.value.hint or ""), e.value.hint


def test_an_unknown_family_names_the_families_and_a_close_one() -> None:
    with pytest.raises(UsageError) as e:
        parse("v9z-8")
    assert "v2, v3, v4, v5p, v5litepod, v5e, v6e, tpu7x" in (e.value.hint or "")
    with pytest.raises(UsageError) as e:
        parse("v6-8")
    assert (e.value.hint or "").startswith("did you mean v6e-8?"), e.value.hint


def test_every_priced_slice_and_every_compute_topology_parses() -> None:
    """The sizes come from the same table fit and pricing use: each of its slices is a valid type."""
    from tpuops.cloud import price_table

    for fam, entry in price_table.table()["families"].items():
        name = "v5litepod" if fam == "v5e" else fam
        for size in entry["slices"]:
            assert parse(f"{name}-{size}").size == int(size)
    assert parse("tpu7x-128").hosts == 16 and parse("tpu7x-128").chips == 64
