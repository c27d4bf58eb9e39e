"""Build the bundled byte-level BPE tokenizer (trainer/assets/tokenizer) that the tiny model ships with.

Usage: python -m trainer.make_tokenizer [OUT_DIR]   (default: the bundled folder; exit 0 done)

A few hundred tokens trained with `tokenizers` on the text of the built-in tasks, saved in Hugging Face
format (tokenizer.json + tokenizer_config.json with a ChatML template), so the tiny model needs no download,
no ../shared and no network. Byte-level: any text encodes (unknown words fall back to bytes). Digits are
always single tokens, so a number's value is spelled digit by digit as in Qwen2.5. Deterministic: running
it again writes the same files (tests/trainer/test_tokenizer.py checks the committed copy).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BUNDLED = Path(__file__).resolve().parent / "assets" / "tokenizer"
VOCAB_SIZE = 384  # at most: 256 bytes + 3 specials + merges (the corpus yields 119: 378 tokens); a cheap head
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # the Qwen2.5 names: pad, turn start, eos
# GPT-2's word split, except that every digit is its own piece (as in Qwen2.5).
SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus() -> list[str]:
    """The training text: every built-in task's prompts and answers in chat form, plus a little English."""
    from trainer import tasks

    lines = [
        "system", "user", "assistant", "The quick brown fox jumps over the lazy dog.",
        tasks.ARITH_SYSTEM, "Think step by step, then answer.",
    ]  # fmt: skip
    for ex in tasks.arith_examples():
        lines += [ex.question, ex.gold or ""]
    lines += [ex.question for ex in tasks.toy_examples()]
    return lines


def build() -> object:
    """The `tokenizers.Tokenizer` (byte-level BPE, single digits, ChatML specials)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def save(out_dir: str | Path = BUNDLED) -> Path:
    """tokenizer.json and tokenizer_config.json in `out_dir` (what trainer.tokenizer.load_tokenizer reads)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build().save(str(out / "tokenizer.json"))  # type: ignore[attr-defined]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": ["<|im_start|>"],
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = save(args[0] if args else BUNDLED)
    print(f"make_tokenizer: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
