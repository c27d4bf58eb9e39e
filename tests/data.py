"""Where the tests' data lives: small copies of GSM8K, the Qwen2.5 tokenizer and model configs, in the layout
`data.root` expects (tests/fixtures/data/README.md). The suite never reads ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

DATA = Path(__file__).resolve().parent / "fixtures" / "data"


def pythonpath(*first: Path) -> str:
    """PYTHONPATH for a process a test starts: `first`, then the session's own (tests/conftest.py puts
    tests/jax_share there, so multi-process trainer runs share their compiles)."""
    own = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([*map(str, first), *([own] if own else [])])
