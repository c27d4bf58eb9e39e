"""`data.root` is the one place the trainer looks for gsm8k/ and qwen2.5-tokenizer/ (no environment variable)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trainer import config, data, tasks
from trainer.make_tiny import tokenizer_files
from trainer.make_tokenizer import BUNDLED

# Where a checkout beside the shared data folder finds it (what data.root "" means).
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _rows(folder: Path, questions: list[tuple[str, str]]) -> None:
    folder.mkdir(parents=True)
    lines = [json.dumps({"question": q, "answer": f"work #### {a}"}) for q, a in questions]
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")


def test_the_gsm8k_task_reads_its_prompts_under_data_root(tmp_path: Path, monkeypatch) -> None:
    _rows(tmp_path / "gsm8k", [("How many?", "1,204"), ("And now?", "7")])
    monkeypatch.setenv("TRAINER_DATA_DIR", str(tmp_path / "elsewhere"))  # the old side door: no longer read
    cfg = config.load("tiny", [f"data.root={tmp_path}"])
    got = tasks.get("gsm8k").examples(cfg)
    assert [(e.question, e.gold) for e in got] == [("How many?", "1204"), ("And now?", "7")]


def test_an_empty_data_root_is_the_shared_folder_beside_the_checkout() -> None:
    assert config.load("tiny").data.root == ""
    assert data.data_dir("").resolve() == SHARED.resolve()
    assert data.data_dir("~/d") == Path.home() / "d"


def test_the_qwen_tokenizer_comes_from_data_root(tmp_path: Path) -> None:
    folder = tmp_path / "qwen2.5-tokenizer"
    folder.mkdir()
    shutil.copyfile(BUNDLED / "tokenizer.json", folder / "tokenizer.json")
    assert tokenizer_files("qwen2.5", str(tmp_path)) == folder
    assert tokenizer_files(None, str(tmp_path)) == folder
