"""Reward functions: GSM8K answers, format, tags, the toy task; a raising function costs one sample."""

from __future__ import annotations

import sys
import threading

import pytest

from trainer.data import gold_answer
from trainer.grpo import rewards
from trainer.grpo.rewards import Sample, score

GOOD = "<reasoning>\n5 + 7 = 12\n</reasoning>\n<answer>\n12\n</answer>"


def test_gold_answer_is_the_number_after_hashes() -> None:
    assert gold_answer("She has 5 + 7 = <<5+7=12>>12 apples.\n#### 1,200") == "1200"


def test_correctness_format_and_tags() -> None:
    assert rewards.correctness(Sample(GOOD, "12")) == 1.0
    assert rewards.correctness(Sample(GOOD, "13")) == 0.0
    assert rewards.correctness(Sample("so the total is 12 dollars", "12")) == 1.0  # last number, no tags
    assert rewards.correctness(Sample("<answer>\\frac{24}{2}</answer>", "12")) == 1.0  # math_verify parses it
    assert rewards.format_reward(Sample(GOOD)) == 1.0 and rewards.format_reward(Sample("12")) == 0.0
    assert rewards.tag_count(Sample("<answer>12</answer>")) == 0.5


def test_two_plain_numbers_that_differ_are_wrong_without_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """The common case of a wrong answer costs no symbolic parse (math_verify: ~40 ms a sample)."""
    monkeypatch.setitem(sys.modules, "math_verify", None)  # importing it would now raise
    assert rewards.correctness(Sample("<answer>\n1,300\n</answer>", "1200")) == 0.0
    assert rewards.correctness(Sample("so it is -7.5 in the end", "7.5")) == 0.0
    assert rewards.correctness(Sample("<answer>1,200</answer>", "1200")) == 1.0
    with pytest.raises(ImportError):  # not plain numbers: math_verify decides
        rewards.correctness(Sample("<answer>\\frac{24}{3}</answer>", "12"))


def test_math_verify_works_off_the_main_thread() -> None:
    out: list[float] = []
    t = threading.Thread(
        target=lambda: out.append(rewards.correctness(Sample("<answer>\\frac{24}{2}</answer>", "12")))
    )
    t.start()
    t.join()
    assert out == [1.0]


def test_toy_reward_is_the_fraction_of_target_tokens() -> None:
    assert rewards.toy(Sample("", token_ids=(5, 9, 5, 3), target_ids=range(6))) == 0.75


def test_a_raising_reward_scores_minus_one_and_is_counted(monkeypatch) -> None:
    def broken(s: Sample) -> float:
        if s.text == "boom":
            raise RuntimeError("bug in a reward")
        return 1.0

    monkeypatch.setitem(rewards.REGISTRY, "broken", broken)
    got = score([Sample("ok"), Sample("boom"), Sample("ok")], {"broken": 2.0})
    assert got.total_N.tolist() == [2.0, -2.0, 2.0]
    assert got.errors == {"broken": 1}


def test_arith_rewards_take_a_bare_ascii_number_and_the_exact_sum() -> None:
    assert [rewards.number(Sample(t)) for t in ("7", " 12\n", "-3", "7 apples", "seven", "", "߂", "7.5")] == [
        1.0,
        1.0,
        1.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ]  # fmt: skip  ("߂" is NKo digit two: \d would take it, a reward hack the tiny model found)
    assert rewards.exact(Sample(" 7\n", "7")) == 1.0
    assert rewards.exact(Sample("77", "7")) == 0.0 and rewards.exact(Sample("7", None)) == 0.0
    mixed = score([Sample("7", "7"), Sample("44", "7"), Sample("x", "7")], {"number": 0.9, "exact": 0.1})
    assert mixed.total_N.tolist() == pytest.approx([1.0, 0.9, 0.0]) and mixed.per_name[
        "exact"
    ] == pytest.approx(1 / 3)
