"""The real Qwen2.5 tokenizer: chat template, left padding to the smallest bucket, decode with masks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainer import tokenizer as tok
from trainer.make_tokenizer import BUNDLED

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def qwen_tok(tokenizer_dir: Path) -> object:
    return tok.load_tokenizer(tokenizer_dir)


def test_chat_prompts_are_left_padded_to_the_smallest_bucket(qwen_tok: object) -> None:
    chats = [[{"role": "user", "content": "What is 12 * 7?"}], [{"role": "user", "content": "Hi"}]]
    ids, mask = tok.encode_chat(qwen_tok, chats, bucket_lengths=(64, 32, 128))
    lengths = mask.sum(axis=1)
    assert ids.shape == (2, 64) and 32 < lengths.max() <= 64 and lengths[0] > lengths[1]
    assert (mask[:, -1] == 1).all() and (ids[mask == 0] == tok.pad_id(qwen_tok)).all()
    text = tok.decode(qwen_tok, ids, mask, skip_special_tokens=False)[1]
    assert text.startswith("<|im_start|>system\n") and text.endswith("Hi<|im_end|>\n<|im_start|>assistant\n")
    assert ids.max() < 151_936


def test_special_ids_and_bucket_errors(qwen_tok: object) -> None:
    assert tok.pad_id(qwen_tok) == 151_643
    assert tok.eos_ids(qwen_tok) == (151_643, 151_645)
    with pytest.raises(ValueError, match="exceeds the largest bucket 8"):
        tok.encode_chat(
            qwen_tok, [[{"role": "user", "content": "a long question " * 4}]], bucket_lengths=(8,)
        )


def test_right_padding_and_masked_decode(qwen_tok: object) -> None:
    ids, mask = tok.pad_batch([[1, 2, 3], [4]], 5, 0, side="right")
    np.testing.assert_array_equal(ids, [[1, 2, 3, 0, 0], [4, 0, 0, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    hello = qwen_tok("Hello world", add_special_tokens=False)["input_ids"]
    ids, mask = tok.pad_batch([[*hello, 151_645, 9707]], 8, 151_643, side="right")
    mask[0, len(hello) + 1 :] = 0  # completion mask stops after EOS
    assert tok.decode(qwen_tok, ids, mask) == ["Hello world"]


def test_masked_decode_in_one_rust_call_equals_row_by_row(qwen_tok: object) -> None:
    """decode() hands every row to the Rust tokenizer at once: the same texts as transformers' decode per row
    (random ids over the whole vocabulary, special tokens among them, ragged masks)."""
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 151_665, size=(16, 64))
    ids[:, 5] = 151_645  # <|im_end|>, skipped as special
    mask = (np.arange(64)[None, :] < rng.integers(1, 65, size=(16, 1))).astype(np.int32)
    want = [
        qwen_tok.decode(r[m.astype(bool)].tolist(), skip_special_tokens=True)
        for r, m in zip(ids, mask, strict=True)
    ]
    assert tok.decode(qwen_tok, ids, mask) == want
    assert len(set(want)) == 16 and all("<|im_end|>" not in t for t in want)


def test_the_tokenizer_matches_autotokenizer_and_imports_neither_transformers_nor_torch(
    qwen_tok: object, tokenizer_dir: Path
) -> None:
    """The trainer reads the folder with `tokenizers` and jinja2 (transformers' import is ~0.7 s of CPU in every
    trainer process; its auto classes import PyTorch where installed): the same ids, chat template, special ids,
    vocabulary size and decoding as AutoTokenizer gives, for Qwen2.5's folder and the bundled one."""
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    chat = [
        {"role": "system", "content": "Think, then answer."},
        {"role": "user", "content": "What is 12 * 7?"},
    ]
    assert qwen_tok.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    ) == auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    text = "Natalia sold clips to 48 of her friends<|im_end|> naïve café ☃ 漢字 #### 1,000\n"
    ids = auto(text, add_special_tokens=False)["input_ids"]
    assert qwen_tok(text, add_special_tokens=False)["input_ids"] == ids
    for skip in (True, False):
        assert qwen_tok.decode(ids, skip_special_tokens=skip) == auto.decode(ids, skip_special_tokens=skip)
    assert (tok.pad_id(qwen_tok), tok.eos_ids(qwen_tok)) == (tok.pad_id(auto), tok.eos_ids(auto))
    assert importlib.util.find_spec("torch") is not None  # installed (test extra): the check can fail
    assert len(qwen_tok) == len(auto)  # type: ignore[arg-type]
    bundled, bundled_auto = tok.load_tokenizer(BUNDLED), AutoTokenizer.from_pretrained(str(BUNDLED))
    assert bundled.apply_chat_template(chat, add_generation_prompt=True) == bundled_auto.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    )
    assert bundled("12 * 7 = 84<|im_end|>")["input_ids"] == bundled_auto("12 * 7 = 84<|im_end|>")["input_ids"]
    assert (len(bundled), tok.pad_id(bundled), tok.eos_ids(bundled)) == (
        len(bundled_auto), tok.pad_id(bundled_auto), tok.eos_ids(bundled_auto),
    )  # fmt: skip
    load = f"from trainer import tokenizer; tokenizer.load_tokenizer({str(tokenizer_dir)!r})"
    code = f"import sys; {load}; print('torch' in sys.modules, 'transformers' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert r.stdout.strip() == "False False", r.stderr[-2000:]
