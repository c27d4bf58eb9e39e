"""Where the tests' data lives: small copies of GSM8K, the Qwen2.5 tokenizer and model configs, in the layout
`data.root` expects (tests/fixtures/data/README.md). The suite never reads ../shared/data."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "fixtures" / "data"
