"""JSON as tpuops writes it (--json, result.json, report --json): valid for every parser, non-finite numbers as null.

Python's json module writes NaN and Infinity, which JSON.parse, jq and most other readers reject. The rule
(docs/contracts.md, "JSON output"): a float that is NaN, +inf or -inf is written as `null`, wherever it sits;
the text report shows it as it came (`nan`, `inf`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable


def finite(data: object) -> object:
    """`data` with every non-finite float (NaN, inf, -inf) replaced by None, in dicts, lists and tuples."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite(v) for v in data]
    return data


def dumps(
    data: object, *, default: Callable[[object], object] | None = str, indent: int | None = None
) -> str:
    """json.dumps under the rule above; `default` turns other objects into JSON (str by default)."""

    # An object `default` turns into a float or a container is made finite too.
    def convert(o: object) -> object:
        return finite(default(o)) if default is not None else o

    return json.dumps(finite(data), default=convert, allow_nan=False, indent=indent)
