"""The one renderer of parameter values into templates and trainer arguments (sop/model.py: fill, fill_argv,
trainer_override): values stay data in shell text, lists splice as words, secrets never reach a command line."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from tpuops.errors import UsageError
from tpuops.sop import loader
from tpuops.sop.model import fill, fill_argv, trainer_override

NASTY = ["a b", "it's", '"$(touch /tmp/x)"', "; rm -rf ~", "`id`", "tab\there", "new\nline", "*", ""]


@pytest.mark.parametrize("value", NASTY)
def test_a_value_in_shell_text_is_one_word_that_runs_nothing(value: str) -> None:
    text = fill("printf '%s\\n' {v}", {"v": value}, shell_words=True)
    assert shlex.split(text) == ["printf", "%s\\n", value]
    out = subprocess.run(["sh", "-c", text], capture_output=True, text=True, check=True).stdout
    assert out == value + "\n"


def test_a_list_splices_as_quoted_words_and_a_path_keeps_the_remote_home() -> None:
    scope: dict[str, object] = {"sets": ["--set=train.lr=1e-5", "--set=data.name=a b"], "dir": "~/runs/x y"}
    text = fill("python -m trainer {sets} > {dir}/log", scope, shell_words=True, paths={"dir"})
    assert shlex.split(text)[:4] == ["python", "-m", "trainer", "--set=train.lr=1e-5"]
    assert shlex.split(text)[4] == "--set=data.name=a b"
    assert text.endswith("> \"$HOME\"/'runs/x y'/log")
    assert fill("{sets} in {dir}", scope) == "--set=train.lr=1e-5 --set=data.name=a b in ~/runs/x y"


def test_shell_text_and_escaped_braces_are_left_as_they_are() -> None:
    assert fill("${HOME} {{x}} {n}", {"n": 3}) == "${HOME} {{x}} 3"


def test_an_unknown_key_is_exit_2_naming_it() -> None:
    with pytest.raises(UsageError) as e:
        fill("run {steps} {stepz}", {"steps": 2})
    assert "{stepz}" in e.value.message and "steps" in (e.value.hint or "")
    assert int(e.value.exit_code) == 2


def test_an_argv_splices_a_whole_list_word_and_fills_the_others() -> None:
    scope: dict[str, object] = {
        "py": "/usr/bin/python3",
        "sets": ["--set=a.b=1", "--set=c.d=x y"],
        "cfg": "tiny",
    }
    argv = fill_argv(["{py}", "-m", "trainer", "--config={cfg}", "{sets}", "--print-config"], scope)
    assert argv == ["/usr/bin/python3", "-m", "trainer", "--config=tiny", "--set=a.b=1", "--set=c.d=x y",
                    "--print-config"]  # fmt: skip


def test_a_trainer_override_is_one_word_with_booleans_as_the_trainer_parses_them() -> None:
    assert trainer_override("train.steps", 20) == "--set=train.steps=20"
    assert trainer_override("eval.enabled", True) == "--set=eval.enabled=true"
    assert trainer_override("data.name", "a b; c") == "--set=data.name=a b; c"


@pytest.mark.parametrize("key", ["wandb.api_key", "hub.token", "db.password", "x.secret", "gcs.credentials"])
def test_a_secret_is_never_rendered_into_trainer_arguments(key: str) -> None:
    with pytest.raises(UsageError) as e:
        trainer_override(key, "hunter2-value")
    assert key in e.value.message and "hunter2-value" not in e.value.message + (e.value.hint or "")


@pytest.mark.parametrize("key", ["data.tokenizer", "rollout.max_new_tokens", "train.secrets_dir_count"])
def test_keys_that_only_contain_a_secret_word_are_settings(key: str) -> None:
    assert trainer_override(key, 1) == f"--set={key}=1"


def test_the_grpo_sop_turns_sets_into_trainer_arguments_through_the_one_renderer() -> None:
    sop = loader.load(loader.find("grpo"))
    base = {"repo_url": "https://example.com/r.git", "branch": "main"}
    values = sop.resolve({**base, "train.steps": "20", "train.lr": "1e-5"})
    given = values[sop.overrides or ""]
    assert isinstance(given, list) and given[-2:] == ["--set=train.steps=20", "--set=train.lr=1e-5"]
    with pytest.raises(UsageError, match=r"wandb\.api_key"):
        sop.resolve({**base, "wandb.api_key": "k"})
