"""Reward functions by name (weights from the config); a function that raises scores −1 for that sample."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

SYSTEM_PROMPT = (
    "Think step by step, then answer. Respond in exactly this format:\n"
    "<reasoning>\n...\n</reasoning>\n<answer>\nthe final number only\n</answer>"
)
_FORMAT = re.compile(r"^\s*<reasoning>.*?</reasoning>\s*<answer>.*?</answer>\s*$", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
ERROR_SCORE = -1.0


@dataclass(frozen=True)
class Sample:
    text: str  # the decoded completion
    gold: str | None = None  # the reference answer (GSM8K: the number after ####)
    token_ids: tuple[int, ...] = ()  # the completion's tokens up to and including EOS
    target_ids: frozenset[int] | range | None = None  # toy task: the token ids that count as hits


def extract_answer(text: str) -> str | None:
    """The <answer> tag's content, else the last number in the text."""
    m = _ANSWER.search(text)
    if m:
        return m.group(1).strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def correctness(s: Sample) -> float:
    """1 if the final answer equals the gold answer (math_verify where it parses, else numeric), else 0."""
    if s.gold is None:
        return 0.0
    answer = extract_answer(s.text)
    if answer is None:
        return 0.0
    gold_n, got_n = _number(s.gold), _number(answer)
    if gold_n is not None and got_n is not None and abs(gold_n - got_n) < 1e-6:
        return 1.0
    if _NUMBER.fullmatch(s.gold.strip()) and _NUMBER.fullmatch(answer.strip()):
        # Two plain numbers that differ: math_verify would say so too, at ~40 ms a sample (5 s of host time for
        # 128 wrong completions: trainer.fit.host, docs/performance.md).
        return 0.0
    from math_verify import parse, verify

    # math_verify's timeouts use SIGALRM, which only works on the main thread: off it, disable them.
    main = threading.current_thread() is threading.main_thread()
    gold = parse(s.gold, parsing_timeout=5 if main else None)
    got = parse(answer, parsing_timeout=5 if main else None)
    if not gold or not got:
        return 0.0
    return 1.0 if verify(gold, got, timeout_seconds=5 if main else None) else 0.0


def format_reward(s: Sample) -> float:
    return 1.0 if _FORMAT.match(s.text) else 0.0


def tag_count(s: Sample) -> float:
    """0.25 for each of the four tags present exactly once."""
    tags = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
    return sum(0.25 for t in tags if s.text.count(t) == 1)


def toy(s: Sample) -> float:
    """The fraction of completion tokens whose id is in the target set (the learnable toy task)."""
    if not s.token_ids or s.target_ids is None:
        return 0.0
    return sum(1 for t in s.token_ids if t in s.target_ids) / len(s.token_ids)


_BARE_NUMBER = re.compile(r"-?[0-9]+")  # ASCII digits: \d would take "߂" (NKo two)


def number(s: Sample) -> float:
    """1 if the completion, stripped, is a bare integer ("12"; not "12 apples", "twelve" or ""), else 0."""
    return 1.0 if _BARE_NUMBER.fullmatch(s.text.strip()) else 0.0


def exact(s: Sample) -> float:
    """1 if the completion, stripped, is exactly the gold answer ("7" for "What is 3 + 4?"), else 0."""
    return 1.0 if s.gold is not None and s.text.strip() == s.gold else 0.0


REGISTRY: dict[str, Callable[[Sample], float]] = {
    "number": number,
    "exact": exact,
    "correctness": correctness,
    "format": format_reward,
    "tag_count": tag_count,
    "toy": toy,
}


@dataclass
class Scores:
    total_N: np.ndarray
    per_name: dict[str, float] = field(default_factory=dict)  # mean of each function
    errors: dict[str, int] = field(default_factory=dict)  # samples where a function raised


def score(samples: Sequence[Sample], weights: dict[str, float]) -> Scores:
    """Weighted sum of the named reward functions; one raising function never stops the run."""
    total = np.zeros(len(samples), np.float32)
    out = Scores(total)
    for name, weight in weights.items():
        if weight == 0:
            continue
        fn = REGISTRY[name]
        values = np.zeros(len(samples), np.float32)
        for i, s in enumerate(samples):
            try:
                values[i] = fn(s)
            except Exception:
                values[i] = ERROR_SCORE
                out.errors[name] = out.errors.get(name, 0) + 1
        total += weight * values
        out.per_name[name] = float(values.mean()) if len(values) else 0.0
    return out
