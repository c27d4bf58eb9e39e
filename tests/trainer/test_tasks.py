"""The task registry and the bundled tokenizer: what the self-contained default job (`arith`) is made of."""

from __future__ import annotations

import ast
import json
import re
import typing
from pathlib import Path

import pytest

from tests.data import DATA
from trainer import config, tasks
from trainer import tokenizer as tok
from trainer.make_tokenizer import BUNDLED, save

TRAINER = Path(tasks.__file__).resolve().parent


def test_every_task_the_config_accepts_is_registered_and_the_reverse() -> None:
    choices = typing.get_args(typing.get_type_hints(config.DataConfig)["task"])
    assert sorted(choices) == sorted(tasks.TASKS)
    with pytest.raises(
        ValueError, match=r"data.task must be one of \['arith', 'gsm8k', 'toy'\], received 'x'"
    ):
        tasks.get("x")


def test_arith_questions_are_every_single_digit_sum_below_ten() -> None:
    examples = tasks.arith_examples()
    assert len(examples) == 55 and len({e.question for e in examples}) == 55
    assert examples[17].question == "What is 1 + 7?" and examples[17].gold == "8"
    assert all(sum(map(int, re.findall(r"\d", e.question))) == int(e.gold) for e in examples)
    cfg = config.load("arith")
    assert tasks.get("arith").weights(cfg) == {"number": 0.9, "exact": 0.1}
    assert tasks.get("arith").messages(examples[0]) == [
        {"role": "system", "content": "Answer with the number only."},
        {"role": "user", "content": "What is 0 + 0?"},
    ]


def test_the_bundled_tokenizer_is_what_make_tokenizer_builds(tmp_path: Path) -> None:
    """The committed files are reproducible: rebuilding gives the same bytes (the fixture is not a blob)."""
    save(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (BUNDLED / name).read_bytes(), name
    assert (BUNDLED / "SOURCE.md").exists()


def test_the_bundled_tokenizer_encodes_the_arith_prompts_digit_by_digit() -> None:
    t = tok.load_tokenizer(BUNDLED)
    assert len(t) == 378 and tok.pad_id(t) == 0 and tok.eos_ids(t) == (0, 2)
    longest = 0
    for ex in tasks.arith_examples():
        text = tok.chat_text(t, tasks.get("arith").messages(ex))
        ids = t(text, add_special_tokens=False)["input_ids"]
        assert t.decode(ids) == text
        longest = max(longest, len(ids))
    assert longest <= max(config.load("arith").data.prompt_buckets)
    pieces = t.convert_ids_to_tokens(t("12 + 305", add_special_tokens=False)["input_ids"])
    assert [p for p in pieces if p.strip("Ġ").isdigit()] == ["1", "2", "3", "0", "5"]
    anything = "naïve café ☃ ∑ 漢字"
    assert t.decode(t(anything, add_special_tokens=False)["input_ids"]) == anything  # byte fallback
    assert json.loads((BUNDLED / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"


def test_tasks_declare_what_they_need_and_the_config_asks_them() -> None:
    """Token targets and an eval split are declared by the task; `eval.every` is refused for a task without one."""
    assert [n for n, t in tasks.TASKS.items() if t.token_targets is not None] == ["toy"]
    assert [n for n, t in tasks.TASKS.items() if t.eval_examples is not None] == ["gsm8k"]
    gsm8k = tasks.get("gsm8k").eval_examples(config.load("tiny", [f"data.root={DATA}"]))
    assert len(gsm8k) == 64 and all(ex.gold is not None for ex in gsm8k)  # the fixture's test split
    with pytest.raises(config.ConfigError, match=r"eval\.every needs a task with an eval split \(gsm8k\)"):
        config.load("toy", ["eval.every=5"])
    assert config.load("tiny", ["eval.every=5"]).eval.every == 5


def test_no_module_branches_on_a_task_name() -> None:
    """Every task-specific choice goes through the registry: outside tasks.py no trainer module compares a value
    with a task's name or looks one up by a literal name (`task == "toy"`, `tasks.get("gsm8k")`)."""
    names = set(tasks.TASKS)
    found = []
    for path in sorted(TRAINER.rglob("*.py")):
        if path.name == "tasks.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            literals = []
            if isinstance(node, ast.Compare):
                literals = [node.left, *node.comparators]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get":
                literals = node.args
            for lit in literals:
                for item in lit.elts if isinstance(lit, ast.Tuple | ast.List | ast.Set) else [lit]:
                    if isinstance(item, ast.Constant) and item.value in names:
                        found.append(f"{path.relative_to(TRAINER.parent)}:{node.lineno}")
    assert not found, found
