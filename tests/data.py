"""Where the tests' data lives: small copies of GSM8K, the Qwen2.5 tokenizer and model configs, in the layout
`data.root` expects (tests/fixtures/data/README.md). The suite never reads ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

DATA = Path(__file__).resolve().parent / "fixtures" / "data"

# The tokenizer of a toy run that a test signals on a step line it reads (the SIGKILL and SIGTERM resumes, the
# preempted recoveries). On Qwen2.5's 151,936-token vocabulary a toy step takes 0.1-0.5 s: time for the signal to
# land mid-run, before the next checkpoint. On the preset's own 378 tokens a step takes about 0.01 s, and the run
# could save past the step the test means, or end first.
PACED_TOKENIZER = "qwen2.5"


def pythonpath(*first: Path) -> str:
    """PYTHONPATH for a process a test starts: `first`, then the session's own (tests/conftest.py puts
    tests/jax_share there, so multi-process trainer runs share their compiles)."""
    own = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([*map(str, first), *([own] if own else [])])
