"""Checks at the edge: Google Cloud names by the API's own rules, numbers by sign and finiteness (exit 2)."""

from __future__ import annotations

import math
import re

from tpuops.errors import UsageError

# A TPU VM (node) name, as the TPU API and Compute Engine take it (RFC 1035): a lower-case letter, then up to
# 62 lower-case letters, digits or hyphens, not ending with a hyphen.
NODE_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
# A zone: region (`us-east1`, `northamerica-northeast2`) and a one-letter zone suffix.
ZONE = re.compile(r"[a-z]+(?:-[a-z]+)*[0-9]+-[a-z]")
# A project id: 6-30 lower-case letters, digits or hyphens, starting with a letter, not ending with a hyphen;
# older projects may carry a domain prefix (`example.com:my-project`).
PROJECT = re.compile(r"(?:[a-z0-9][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]")

# A region (`us-east1`), as `fit --region` prices in; a zone is taken there too.
REGION = re.compile(r"[a-z]+(?:-[a-z]+)*[0-9]+(?:-[a-z])?")

_RULES = {
    "vm": (NODE_NAME, "a lower-case letter, then lower-case letters, digits or -, at most 63 characters"),
    "zone": (ZONE, "a zone such as us-east1-d or europe-west4-a"),
    "project": (PROJECT, "a project id: 6-30 lower-case letters, digits or -, starting with a letter"),
    "region": (REGION, "a region such as us-east1 or europe-west4, or a zone such as us-east1-d"),
}


def name(kind: str, value: object, where: str) -> str | None:
    """`value` if it is a valid `kind` ("vm", "zone", "project", "region") name; None passes (not given); anything
    else (a number from a TOML file) is exit 2."""
    if value is None:
        return None
    pattern, rule = _RULES[kind]
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise UsageError(f"{where} {value!r} is not a valid {kind} name", hint=rule)
    return value


def number(
    value: object, where: str, *, minimum: float = 0.0, above: bool = True, integer: bool = False
) -> float:
    """A finite number > `minimum` (>= with above=False); an int when `integer`. Anything else is exit 2."""
    ok_type = int if integer else (int, float)
    what = f"a finite {'whole number' if integer else 'number'} {'>' if above else '>='} {minimum:g}"
    if isinstance(value, bool) or not isinstance(value, ok_type):
        raise UsageError(f"{where} must be {what}, received {value!r}")
    if not math.isfinite(value) or (value <= minimum if above else value < minimum):
        raise UsageError(f"{where} must be {what}, received {value!r}")
    return value


def finite(value: float, where: str) -> float:
    """A finite number (NaN and infinities are never a meaningful setting)."""
    if not math.isfinite(value):
        raise UsageError(f"{where} must be a finite number, received {value!r}")
    return value
