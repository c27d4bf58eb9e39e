"""`- include:` fragments and `maps_to` parameters are validated on load like the rest of a SOP file:
one line naming the file, the line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuops.errors import UsageError
from tpuops.sop import loader

FRAGMENT = """\
description: check out and say hello
params:
  repo_dir: {type: path, default: ~/r, description: "checkout"}
  who: {type: str, default: world}
steps:
  - kind: git_sync
    repo: /r
    dir: "{repo_dir}"
  - kind: shell
    command: "echo hello {who}"
"""

SOP = """\
name: t
params:
  who: {default: tpuops}
  n: {type: int, default: 1}
steps:
  - kind: shell
    command: "echo first {n}"
  - include: hello
  - kind: shell
    command: "echo last in {repo_dir}"
"""


def tree(tmp_path: Path, sop: str = SOP, **fragments: str) -> Path:
    (tmp_path / "fragments").mkdir(exist_ok=True)
    for name, text in {"hello": FRAGMENT, **fragments}.items():
        (tmp_path / "fragments" / f"{name}.yaml").write_text(text)
    path = tmp_path / "t.yaml"
    path.write_text(sop)
    return path


def error(path: Path) -> str:
    with pytest.raises(UsageError) as e:
        loader.load(path)
    return e.value.line()


def test_included_steps_take_the_place_of_the_entry_and_params_join(tmp_path: Path) -> None:
    sop = loader.load(tree(tmp_path))
    assert [s.kind for s in sop.steps] == ["shell", "git_sync", "shell", "shell"]
    assert [s.command for s in sop.steps if s.kind == "shell"] == [  # type: ignore[attr-defined]
        "echo first {n}",
        "echo hello {who}",
        "echo last in {repo_dir}",
    ]
    # The SOP refines a fragment's parameter (a new default) and keeps its type and description.
    assert sop.params["who"].default == "tpuops" and sop.params["repo_dir"].type == "path"
    assert sop.resolve({}) == {"repo_dir": "~/r", "who": "tpuops", "n": 1}


def test_a_fragment_may_include_another(tmp_path: Path) -> None:
    outer = "params:\n  x: {type: int, default: 2}\nsteps:\n  - include: hello\n  - kind: shell\n    command: 'echo {x}'\n"
    sop = loader.load(tree(tmp_path, SOP.replace("include: hello", "include: outer"), outer=outer))
    assert [s.kind for s in sop.steps] == ["shell", "git_sync", "shell", "shell", "shell"]
    assert set(sop.params) == {"repo_dir", "who", "x", "n"}


def test_unknown_key_in_a_fragment_names_the_fragment_and_line(tmp_path: Path) -> None:
    path = tree(tmp_path, hello=FRAGMENT.replace("    dir:", "    dirr:"))
    assert error(path) == (
        f"{tmp_path / 'fragments' / 'hello.yaml'}:8: unknown key 'dirr' at steps.0.dirr; did you mean 'dir'?"
    )
    path = tree(tmp_path, hello="name: x\n" + FRAGMENT)
    assert "hello.yaml:1: unknown key 'name' at name" in error(path)


def test_unknown_key_on_an_include_entry(tmp_path: Path) -> None:
    path = tree(tmp_path, SOP.replace("  - include: hello", "  - include: hello\n    when: always"))
    assert error(path) == f"{path}:8: unknown key 'when' at steps.1.when"
    path = tree(tmp_path, SOP.replace("  - include: hello", "  - includ: hello"))
    assert error(path) == (
        f"{path}:8: steps[1] needs kind: (a step) or include: (a fragment); did you mean 'include'?"
    )


def test_missing_fragment_suggests_the_closest(tmp_path: Path) -> None:
    path = tree(tmp_path, SOP.replace("include: hello", "include: helo"))
    line = error(path)
    assert line.startswith(f"{path}:8: no fragment named 'helo'; did you mean 'hello'?")
    assert "hello" in line.split("(fragments: ")[1]  # the hint lists the fragments there are


def test_include_cycles_are_refused(tmp_path: Path) -> None:
    a = "steps:\n  - include: b\n"
    b = "steps:\n  - include: a\n"
    path = tree(tmp_path, SOP.replace("include: hello", "include: a"), a=a, b=b)
    assert (
        error(path)
        == f"{tmp_path / 'fragments' / 'b.yaml'}:2: include cycle: t.yaml -> a.yaml -> b.yaml -> a.yaml"
    )


def test_a_parameter_declared_twice_with_different_types(tmp_path: Path) -> None:
    path = tree(tmp_path, SOP.replace("who: {default: tpuops}", "who: {type: int, default: 3}"))
    frag = tmp_path / "fragments" / "hello.yaml"
    assert error(path) == f"{path}:3: parameter 'who' is declared as int here and as str in {frag}"
    other = "params:\n  who: {type: bool, default: true}\nsteps: []\n"
    path = tree(
        tmp_path, SOP.replace("  - include: hello", "  - include: hello\n  - include: other"), other=other
    )
    assert error(path) == (
        f"{tmp_path / 'fragments' / 'other.yaml'}:2: parameter 'who' is declared as bool here and as str in {frag}"
    )


def test_a_fragment_template_must_name_a_parameter(tmp_path: Path) -> None:
    path = tree(tmp_path, hello=FRAGMENT.replace("hello {who}", "hello {whom}"))
    assert error(path).startswith(
        f"{tmp_path / 'fragments' / 'hello.yaml'}: steps[1].command uses {{whom}}, which is not a parameter; "
        "did you mean 'who'?"
    )


def test_a_fragment_is_not_a_sop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sops").mkdir()
    tree(tmp_path / "sops")
    monkeypatch.chdir(tmp_path)
    names = [row[0] for row in loader.list_sops()]
    assert "t" in names and "grpo" in names
    assert not {"hello", "prepare", "checkout", "send-env", "tpu-lock"} & set(names)
    assert loader.scan_sops()[1] == []  # nor a broken SOP
    with pytest.raises(UsageError, match="no SOP named 'prepare'"):
        loader.find("prepare")
    with pytest.raises(
        UsageError, match=r"hello.yaml: a fragment \(steps and params SOPs include\), not a SOP"
    ):
        loader.load(tmp_path / "sops" / "fragments" / "hello.yaml")


TRAINER_SOP = """\
name: t
params:
  steps: {type: int, maps_to: train.steps}
  sets: {type: list, default: []}
overrides: sets
steps:
  - kind: shell
    command: "python -m trainer.main {sets}"
"""


def test_maps_to_passes_the_value_only_when_set(tmp_path: Path) -> None:
    sop = loader.load(tree(tmp_path, TRAINER_SOP))
    assert sop.resolve({}) == {"sets": []}
    assert sop.resolve({"steps": "4", "train.lr": "0.1"}) == {
        "steps": 4,
        "sets": ["--set=train.steps=4", "--set=train.lr=0.1"],
    }
    assert sop.resolve({}, {"steps": 9}) == {"steps": 9, "sets": ["--set=train.steps=9"]}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("train.steps}", "steps}"),
            ":3: params.steps.maps_to: 'steps' is not a trainer key (section.key, e.g. train.steps)",
        ),
        (("train.steps}", "Train.steps}"), ":3: params.steps.maps_to: 'Train.steps' is not a trainer key"),
        (("overrides: sets\n", ""), ":3: params.steps.maps_to needs `overrides:` naming the list parameter"),
        (
            ("overrides: sets", "overrides: set"),
            ":5: overrides: 'set' must name a list parameter; did you mean 'sets'?",
        ),
        (
            ("{type: int, maps_to", "{type: list, maps_to"),
            ":3: params.steps.maps_to: a list parameter cannot stand",
        ),
        (
            ("main {sets}", "main --steps {steps} {sets}"),
            ": steps[0].command uses {steps}, which maps to train.steps",
        ),
    ],
)
def test_maps_to_is_checked_on_load(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    path = tree(tmp_path, TRAINER_SOP.replace(*change))
    assert error(path).startswith(f"{path}{message}")


def test_two_parameters_cannot_map_to_one_key(tmp_path: Path) -> None:
    text = TRAINER_SOP.replace("  sets:", "  n: {type: int, maps_to: train.steps}\n  sets:")
    path = tree(tmp_path, text)
    assert error(path) == f"{path}:4: params.n.maps_to: train.steps is already the trainer key of 'steps'"


def test_bundled_sops_take_their_shared_steps_from_fragments() -> None:
    kinds = {name: [s.kind for s in loader.load(loader.find(name)).steps] for name in
             ("grpo", "gradcheck", "microbench", "smoke", "sync")}  # fmt: skip
    assert kinds["grpo"][:4] == ["git_sync", "python_env", "clear_lockfile", "sync_env"]
    assert kinds["gradcheck"][:3] == kinds["microbench"][:3] == ["git_sync", "python_env", "clear_lockfile"]
    assert kinds["smoke"][:3] == kinds["sync"] == ["git_sync", "clear_lockfile", "sync_env"]
    for name in kinds:  # declared once, in sops/fragments/, not copied into the SOP file
        text = loader.find(name).read_text()
        assert "kind: git_sync" not in text and "repo_url:" not in text, name
