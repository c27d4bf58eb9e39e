"""Bad names and numbers stop at the edge: one line, exit 2, nothing run (the real entry point)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.tpuops.test_usage_errors import ENTRY, _one_line, tpuops
from tpuops.config import validators
from tpuops.errors import UsageError


def _nothing_ran(tmp_path: Path) -> None:
    assert not (tmp_path / "ran").exists()
    runs = Path(os.environ["TPUOPS_HOME"]) / "runs"
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--vm", "a/b"], "--vm 'a/b' is not a valid vm name"),
        (["--vm", "My-VM"], "--vm 'My-VM' is not a valid vm name"),
        (["--vm", "v", "--zone", "us-east1-d/../x"], "--zone 'us-east1-d/../x' is not a valid zone name"),
        (["--vm", "v", "--project", "p/q"], "--project 'p/q' is not a valid project name"),
        (["--vm", "v", "--unreachable-s", "inf"], "--unreachable-s must be a finite number >= 1"),
        (
            ["--local", "--set", "timeout=-1"],
            "step field timeout must be a number of seconds > 0, received '-1.0'",
        ),
        (["--local", "--set", "timeout=0"], "step field timeout must be a number of seconds > 0"),
        (["--local", "--set", "timeout=nan"], "parameter timeout must be a finite number, received 'nan'"),
        (["--local", "--set", "timeout=inf"], "parameter timeout must be a finite number, received 'inf'"),
    ],
)
def test_bad_names_and_numbers_on_the_command_line(argv: list[str], says: str, tmp_path: Path) -> None:
    r = tpuops("sop", "run", "exec", *argv, "--set", f"cmd=touch {tmp_path / 'ran'}", cwd=tmp_path)
    assert says in _one_line(r)
    _nothing_ran(tmp_path)


@pytest.mark.parametrize(
    "toml, says",
    [
        ("parallel = 0", "parallel must be a finite whole number >= 1, received 0"),
        ("parallel = -3", "parallel must be a finite whole number >= 1, received -3"),
        ("parallel = 2.5", "parallel must be a finite whole number >= 1, received 2.5"),
        ('unreachable_s = "soon"', "unreachable_s must be a finite number >= 1, received 'soon'"),
        ("unreachable_s = nan", "unreachable_s must be a finite number >= 1, received nan"),
        ("key_ttl = -5", "key_ttl must be a finite number > 0, received -5"),
        ('zone = "us/east1"', "zone 'us/east1' is not a valid zone name"),
        ('vm = "a b"', "vm 'a b' is not a valid vm name"),
    ],
)
def test_bad_values_in_tpuops_toml(toml: str, says: str, tmp_path: Path) -> None:
    (tmp_path / "tpuops.toml").write_text(toml + "\n")
    r = tpuops("sop", "run", "exec", "--local", "--set", f"cmd=touch {tmp_path / 'ran'}", cwd=tmp_path)
    line = _one_line(r)
    assert str(tmp_path / "tpuops.toml") in line and says in line, line
    _nothing_ran(tmp_path)


@pytest.mark.parametrize(
    "kind, good",
    [
        ("vm", ["a", "mllm-jax-v6e-8", "x" * 63]),
        ("zone", ["us-east1-d", "europe-west4-a", "northamerica-northeast2-b", "us-central2-b"]),
        ("project", ["tpuops-grpo", "my-project-123456", "example.com:my-project"]),
    ],
)
def test_valid_names_pass(kind: str, good: list[str]) -> None:
    for value in good:
        assert validators.name(kind, value, f"--{kind}") == value
    for bad in ["", "-a", "a-", "A", "a_b", "a/b", "x" * 64 if kind == "vm" else "a" * 31]:
        with pytest.raises(UsageError):
            validators.name(kind, bad, f"--{kind}")


@pytest.mark.parametrize(
    "command", [["describe"], ["wait"], ["delete", "--yes"], ["create", "--accelerator", "v6e-8"]]
)
def test_a_bad_vm_name_in_vm_commands_is_one_line_not_a_traceback(command: list[str], tmp_path: Path) -> None:
    """No TPU API is reachable at this endpoint: the name is refused before anything is asked."""
    argv = [
        "vm",
        command[0],
        "a/b",
        *command[1:],
        "--zone",
        "us-east1-d",
        "--api-endpoint",
        "http://127.0.0.1:9",
    ]
    assert "NAME 'a/b' is not a valid vm name" in _one_line(tpuops(*argv, cwd=tmp_path))


# Every command that takes a Google Cloud name, with what else it needs to parse ({bad}: the malformed name;
# {file}: a plain file, so that `emulator serve`, were its --zone not checked, fails at once instead of serving).
NAMED = {
    ("run",): ["exec"],
    ("recompile-check",): [],
    ("gradcheck",): [],
    ("microbench",): [],
    ("doctor",): [],
    ("sop", "run"): ["exec"],
    ("bench", "rollout"): [],
    ("vm", "list"): [],
    ("vm", "describe"): ["{vm}"],
    ("vm", "create"): ["{vm}", "--accelerator", "v4-8"],
    ("vm", "delete"): ["{vm}", "--yes"],
    ("vm", "wait"): ["{vm}"],
    ("vm", "clean"): ["{vm}"],
    ("vm", "autostop"): ["{vm}", "30m"],
    ("fit",): ["qwen2.5-3b-v6e-8"],
    ("emulator", "serve"): ["--state-dir", "{file}/state"],
    ("emulator", "fault", "capacity"): ["{zone}"],
}
BAD = {
    "vm": ("--vm", "A_B"),
    "zone": ("--zone", "x/y"),
    "project": ("--project", "a b"),
    "region": ("--region", "x/y"),
}


def _named_commands() -> dict[tuple[str, ...], set[str]]:
    """Each command path -> the Google Cloud names it takes (vm, zone, project, region), from the Typer tree."""
    import typer

    from tpuops.cli import app

    found: dict[tuple[str, ...], set[str]] = {}

    def walk(cmd: object, path: tuple[str, ...]) -> None:
        for sub_name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
            walk(sub, (*path, sub_name))
        kinds = {p.name for p in getattr(cmd, "params", []) if p.name in BAD}
        if "vm" in path and any(p.name == "name" for p in getattr(cmd, "params", [])):
            kinds.add("vm")  # `vm describe NAME`: the VM's name is the argument
        if kinds:
            found[path] = kinds

    walk(typer.main.get_command(app), ())
    return found


def test_every_command_taking_a_google_name_is_in_the_table() -> None:
    assert set(_named_commands()) == set(NAMED)


@pytest.mark.parametrize(
    "path, kind", [(p, k) for p, kinds in _named_commands().items() for k in sorted(kinds)], ids=str
)
def test_a_malformed_name_is_exit_2_on_every_command(
    path: tuple[str, ...], kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process, at the parse: a command that let it through would reach no Google API (a dead
    endpoint) and fail another way."""
    import typer

    from tpuops.cli import app

    monkeypatch.setenv("TPUOPS_TPU_API", "http://127.0.0.1:9")
    monkeypatch.setenv("TPUOPS_API_TIMEOUT", "0.5")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    option, bad = BAD[kind]
    fill = {"vm": "my-vm", "zone": "us-east1-d", "file": str(tmp_path / "file")}
    args = [a.format(**fill) for a in NAMED[path]]
    if f"{{{kind}}}" in NAMED[path]:  # the name is the command's argument (`vm describe NAME`)
        args[NAMED[path].index(f"{{{kind}}}")], option = bad, {"vm": "NAME", "zone": "ZONE"}[kind]
    else:
        args += [option, bad]
    with pytest.raises(UsageError) as e:
        typer.main.get_command(app).main([*path, *args], standalone_mode=False, prog_name="tpuops")
    assert e.value.exit_code == 2 and "\n" not in e.value.line(), e.value.line()
    assert e.value.line().startswith(f"{option} {bad!r} is not a valid {kind} name"), e.value.line()


@pytest.mark.parametrize("var", ["GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"])
def test_a_malformed_project_from_the_environment_is_exit_2_naming_the_variable(
    var: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")}
    r = subprocess.run(
        [*ENTRY, "vm", "list"], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
        stdin=subprocess.DEVNULL, env={**env, var: "a b", "TPUOPS_TPU_API": "http://127.0.0.1:9"},
    )  # fmt: skip
    assert f"{var} 'a b' is not a valid project name" in _one_line(r)
