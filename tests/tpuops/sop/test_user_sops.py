"""SOP files in the user's repository: the nearest sops/ (or tpuops.toml's sops_dir) before the built-ins, a user
SOP of a built-in's name wins and may extend it, `sop list` says which is which, `sop new` writes one that loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpuops.config import TargetSpec
from tpuops.errors import UsageError
from tpuops.run import launch
from tpuops.sop import loader
from tpuops.sop import new as new_sop

HELLO = """name: {name}
description: Say hello from the user's own SOP.
steps:
  - kind: shell
    command: "echo hello"
"""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_the_nearest_sops_folder_wins_over_the_built_ins_and_sop_list_says_which(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "sops").mkdir(parents=True)
    (repo / "sops" / "hello.yaml").write_text(HELLO.format(name="hello"))
    # Same name as a built-in: the user's wins, and may start from the built-in it shadows.
    (repo / "sops" / "recompile-check.yaml").write_text(
        "name: recompile-check\nextends: recompile-check\nparams:\n  steps: {default: 3}\n"
    )
    deep = repo / "src" / "pkg"
    deep.mkdir(parents=True)
    assert loader.search_dirs(deep) == [(repo / "sops").resolve(), loader.sops_dir()]
    assert loader.find("hello", loader.search_dirs(deep)) == (repo / "sops" / "hello.yaml").resolve()
    mine = loader.load(loader.find("recompile-check", loader.search_dirs(deep)))
    assert mine.params["steps"].default == 3 and mine.scan is not None and mine.scan.fail_on_recompile
    listed = cli("sop", "list", "--json", cwd=deep)
    assert listed.returncode == 0, listed.stderr
    origin = {row["name"]: row["origin"] for row in json.loads(listed.stdout)}
    assert origin["hello"] == "user" and origin["recompile-check"] == "user (shadows the built-in)"
    assert origin["grpo"] == "built-in" and origin["job"] == "built-in"
    dry = launch.start(launch.RunRequest(sop="hello", target=TargetSpec(local=True), dry_run=True), cwd=deep)
    assert dry.planned is not None and dry.sop == "hello"


def test_sops_dir_in_tpuops_toml_names_the_folder(tmp_path: Path) -> None:
    (tmp_path / "ops" / "procedures").mkdir(parents=True)
    (tmp_path / "ops" / "procedures" / "hello.yaml").write_text(HELLO.format(name="hello"))
    (tmp_path / "sops").mkdir()  # a sops/ folder that is not the one named: not looked in
    (tmp_path / "tpuops.toml").write_text('sops_dir = "ops/procedures"\n')
    assert loader.user_sops_dir(tmp_path) == (tmp_path / "ops" / "procedures").resolve()
    with pytest.raises(UsageError, match="no SOP named 'nope'"):
        loader.find("nope", loader.search_dirs(tmp_path))


def test_sop_new_writes_a_commented_sop_for_the_users_command_that_runs(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    sub = tmp_path / "scripts"
    sub.mkdir()
    made = cli("sop", "new", "train", "--", "python", "-u", "scripts/train.py", "--set", "lr=1e-4", cwd=sub)
    assert made.returncode == 0, made.stderr
    path = tmp_path / "sops" / "train.yaml"  # the top of the checkout: the SOP travels with the repository
    assert f"wrote {path}" in " ".join(made.stderr.split())
    sop = loader.load(path)
    assert sop.params["cmd"].default == ["python", "-u", "scripts/train.py", "--set", "lr=1e-4"]
    assert "# step_pattern:" in path.read_text() and sop.scan is not None
    again = cli("sop", "new", "train", cwd=tmp_path)
    assert again.returncode == 2 and f"{path} exists" in again.stderr
    with pytest.raises(UsageError, match="lower-case letters"):
        new_sop.write("Bad Name", [], tmp_path)
    dry = cli("run", "train", "--local", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "python -u scripts/train.py --set lr=1e-4" in dry.stdout
    shadow, note = new_sop.write("job", [], tmp_path)
    assert (
        shadow == tmp_path / "sops" / "job.yaml"
        and note is not None
        and "shadows the built-in SOP 'job'" in note
    )


HOSTILE_WORDS = [
    "line one\nline two",
    "tab\there",
    "cr\r",
    "quote \" and ' and \\",
    "{name} {{x}} %s",
    "# not a comment",
    "key: value",
    "- item",
    "é☃ \u2028 \x85 \x07",
    "",
    "  padded  ",
    "*alias &anchor !tag",
    "`$(id)`",
]


@pytest.mark.parametrize("word", HOSTILE_WORDS)
def test_sop_new_carries_any_word_verbatim_or_touches_nothing(tmp_path: Path, word: str) -> None:
    words = ["python", "-c", word, "--flag", word]
    path, _ = new_sop.write("odd", words, tmp_path)
    assert loader.load(path).params["cmd"].default == words
    text = path.read_text()
    description = text.split("description: |\n", 1)[1].split("\n", 1)[0]
    assert description.startswith("  Runs `python -c ")  # one line, whatever the word holds
    # Any SOP that cannot be written (a name past the regex, say) leaves no folder and no file behind.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(UsageError) as e:
        new_sop.write("bad\nname", words, fresh)
    assert e.value.exit_code == 2 and list(fresh.iterdir()) == []


def test_sop_new_on_the_command_line_with_a_newline_in_a_word(tmp_path: Path) -> None:
    made = cli("sop", "new", "nl", "--", "python", "-c", "print(1)\nprint(2)", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert loader.load(tmp_path / "sops" / "nl.yaml").params["cmd"].default == [
        "python",
        "-c",
        "print(1)\nprint(2)",
    ]
