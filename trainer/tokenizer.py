"""The Qwen2.5 tokenizer from a local folder: chat template, left/right padding to fixed length buckets.

Dims: B batch, P padded (bucket) length. Prompts for the sampler are LEFT-padded (the last real token sits
at P - 1 for every row); training targets are right-padded. Nothing here touches the network.
"""

from __future__ import annotations

import bisect
import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

Messages = list[dict[str, str]]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of a local folder (tokenizer.json, and tokenizer_config.json: special tokens, chat template)."""
    folder = Path(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (folder / name).exists():
            raise FileNotFoundError(f"no {name} in {folder}")
    return Tokenizer(folder)


class Tokenizer:
    """A Hugging Face tokenizer folder read with the Rust `tokenizers` library and jinja2, without importing
    transformers (about 0.7 s of CPU in every trainer process): the ids, chat template, special ids and decoding
    transformers' fast tokenizer gives for these folders (tests/trainer/test_tokenizer.py compares them with
    AutoTokenizer). The part of its interface the trainer uses: `tok(text, add_special_tokens=...)["input_ids"]`,
    `decode`, `apply_chat_template`, `convert_tokens_to_ids` (and back), `len(tok)`, the special ids."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer as Backend

        self.backend_tokenizer = Backend.from_file(str(folder / "tokenizer.json"))
        config = json.loads((folder / "tokenizer_config.json").read_text())
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self.chat_template: str | None = config.get("chat_template")
        # Special tokens as their text (a config may give a token as {"content": ...}), for the template too.
        self.special_tokens: dict[str, str] = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            token = config.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str):
                self.special_tokens[key] = token
        self.eos_token_id = self._id("eos_token")
        self.pad_token_id = self._id("pad_token")
        self.unk_token_id = self._id("unk_token")

    def _id(self, key: str) -> int | None:
        token = self.special_tokens.get(key)
        return None if token is None else self.backend_tokenizer.token_to_id(token)

    def __len__(self) -> int:
        return int(self.backend_tokenizer.get_vocab_size(with_added_tokens=True))

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}

    def convert_tokens_to_ids(self, token: str) -> int | None:
        found = self.backend_tokenizer.token_to_id(token)
        return self.unk_token_id if found is None else int(found)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        text = self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if self.clean_up_tokenization_spaces else text

    def apply_chat_template(
        self, messages: Messages, tokenize: bool = False, add_generation_prompt: bool = False
    ) -> str:
        """The folder's chat template rendered as transformers renders it (a sandboxed jinja2 environment,
        trim_blocks and lstrip_blocks, loop controls, `raise_exception`, a `tojson` that keeps non-ASCII)."""
        if tokenize:
            raise ValueError(
                "apply_chat_template(tokenize=True) is not supported: tokenize the text it returns"
            )
        if not self.chat_template:
            raise ValueError("this tokenizer folder has no chat_template in tokenizer_config.json")
        return _template(self.chat_template).render(
            messages=messages, tools=None, documents=None, add_generation_prompt=add_generation_prompt,
            **self.special_tokens,
        )  # fmt: skip


@functools.lru_cache(maxsize=8)
def _template(source: str) -> Any:
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def _clean_up(text: str) -> str:
    """transformers' `clean_up_tokenization` (for folders that ask for it; Qwen2.5's does not)."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
                 (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):  # fmt: skip
        text = text.replace(a, b)
    return text


def pad_id(tokenizer: Any) -> int:
    """The pad id (Qwen2.5: <|endoftext|>, 151643)."""
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)


def eos_ids(tokenizer: Any) -> tuple[int, ...]:
    """Ids that end a completion: the tokenizer's eos (<|im_end|> for Qwen2.5 chat) and <|endoftext|>."""
    ids = {int(tokenizer.eos_token_id)}
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if isinstance(endoftext, int) and endoftext != tokenizer.unk_token_id:
        ids.add(endoftext)
    return tuple(sorted(ids))


def chat_text(tokenizer: Any, messages: Messages) -> str:
    """The chat template applied, ending with the assistant turn's header (generation prompt)."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def pick_bucket(length: int, bucket_lengths: Sequence[int]) -> int:
    """The smallest bucket >= length; an error naming the largest bucket when none fits."""
    buckets = sorted(bucket_lengths)
    i = bisect.bisect_left(buckets, length)
    if i == len(buckets):
        raise ValueError(f"sequence of {length} tokens exceeds the largest bucket {buckets[-1]}")
    return buckets[i]


def pad_batch(
    rows: Sequence[Sequence[int]], length: int, pad: int, *, side: str = "left"
) -> tuple[np.ndarray, np.ndarray]:
    """(ids_BP int32, mask_BP int32) with every row padded to `length` on `side`."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', received {side!r}")
    ids = np.full((len(rows), length), pad, np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for b, row in enumerate(rows):
        if len(row) > length:
            raise ValueError(f"row {b} has {len(row)} tokens, more than the padded length {length}")
        span = slice(length - len(row), length) if side == "left" else slice(0, len(row))
        ids[b, span] = row
        mask[b, span] = 1
    return ids, mask


def encode_chat(
    tokenizer: Any, messages_list: Sequence[Messages], bucket_lengths: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Chat-templated prompts, LEFT-padded to the smallest bucket that fits the longest: (ids_BP, mask_BP)."""
    rows = [tokenizer(chat_text(tokenizer, m), add_special_tokens=False)["input_ids"] for m in messages_list]
    length = pick_bucket(max(len(r) for r in rows), bucket_lengths)
    return pad_batch(rows, length, pad_id(tokenizer), side="left")


def decode(tokenizer: Any, ids_BC: Any, mask_BC: Any, *, skip_special_tokens: bool = True) -> list[str]:
    """Text of each row's masked tokens (completion mask: up to and including EOS).

    All rows in one call of the Rust tokenizer (`decode_batch`, threads across rows) when the Python side adds
    nothing to its text (no clean-up of tokenization spaces, Qwen2.5's setting): a step's 131k tokens took
    0.27 s against 0.56 s row by row on this 2-core machine (trainer.fit.host times it)."""
    ids, mask = np.asarray(ids_BC), np.asarray(mask_BC).astype(bool)
    rows = [row[m].tolist() for row, m in zip(ids, mask, strict=False)]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return list(backend.decode_batch(rows, skip_special_tokens=skip_special_tokens))
    return [tokenizer.decode(row, skip_special_tokens=skip_special_tokens) for row in rows]
