"""Prompts: GSM8K from local JSONL (or the hub on a VM), a resumable seeded prompt stream (tasks: trainer/tasks.py)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


def data_dir(root: str = "") -> Path:
    """Where gsm8k/ and qwen2.5-tokenizer/ live: `root` (data.root), else <repo>/../shared/data."""
    return Path(root).expanduser() if root else Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


@dataclass(frozen=True)
class Example:
    question: str
    gold: str | None  # GSM8K: the number after "####"


def gold_answer(answer_field: str) -> str:
    """GSM8K's reference: the text after the last `####`, without thousands separators."""
    if "####" not in answer_field:
        raise ValueError(f"no '####' in GSM8K answer: {answer_field[-80:]!r}")
    return answer_field.rsplit("####", 1)[1].strip().replace(",", "")


HUB_DATASET = "openai/gsm8k"  # its `main` config, one parquet file per split


def load_gsm8k(path: str, split: str, root: str = "") -> list[Example]:
    """`<folder>/{split}.jsonl` (data.path, or `auto`: <data.root>/gsm8k); `auto` without it: the hub."""
    folder = data_dir(root) / "gsm8k" if path == "auto" else Path(path).expanduser()
    file = folder / f"{split}.jsonl"
    if file.exists():
        rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    elif path == "auto":
        rows = hub_rows(split)
    else:
        raise FileNotFoundError(f"no {split}.jsonl in {folder} (data.path)")
    return [Example(r["question"], gold_answer(r["answer"])) for r in rows]


def hub_rows(split: str) -> list[dict[str, str]]:
    """GSM8K's rows from the Hugging Face hub (a VM with internet; the HF cache, or HF_HUB_OFFLINE, elsewhere)."""
    import pyarrow.parquet as pq
    from huggingface_hub import hf_hub_download

    file = hf_hub_download(HUB_DATASET, f"main/{split}-00000-of-00001.parquet", repo_type="dataset")
    return pq.read_table(file, columns=["question", "answer"]).to_pylist()


class PromptStream:
    """Shuffled epochs of examples; `position` (prompts consumed) makes it resumable from a checkpoint.

    Every process walks the same global order, so each step's prompts are the same everywhere (a few KB of
    text); the batch is split across processes on the devices: each places only its own rows
    (distributed.global_array), so generation and the update run sharded over every host.
    """

    def __init__(self, examples: list[Example], seed: int) -> None:
        if not examples:
            raise ValueError("no examples to train on")
        self.examples, self.seed = examples, seed
        self.position = 0

    def _order(self, epoch: int) -> list[int]:
        idx = list(range(len(self.examples)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(idx)
        return idx

    def next_global(self, n: int) -> list[Example]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.position, len(self.examples))
            out.append(self.examples[self._order(epoch)[i]])
            self.position += 1
        return out
